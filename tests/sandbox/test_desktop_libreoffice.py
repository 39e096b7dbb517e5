"""LibreOffice in the local (bubblewrap) sandbox's display: a manual check, since CI installs no LibreOffice
(`apt-get install -y --no-install-recommends libreoffice-calc`; FORGE_REQUIRE=libreoffice makes its absence a
failure). Debian links /usr/lib/libreoffice/share/registry to /etc/libreoffice/registry: without that
folder bound in (sandbox/local.py GUI_ETC) soffice dies at start and no window ever shows.
bench/desktop_real.py runs a whole OSWorld-format Calc task on it."""

from __future__ import annotations

import shutil
from pathlib import Path

from openforge.sandbox.gui import GuiSpec
from openforge.sandbox.local import LocalSandbox, LocalSandboxConfig, bwrap_usable
from tests.helpers.required import requires

_MISSING = [n for n in ("soffice", "Xvfb", "xdotool", "xkbcomp") if shutil.which(n) is None]
_MISSING += [] if bwrap_usable() else ["bwrap"]
pytestmark = requires("libreoffice", f"needs {', '.join(_MISSING)} (apt-get install -y --no-install-recommends "
                                     "libreoffice-calc xvfb xdotool x11-xkb-utils bubblewrap)" if _MISSING else None)


async def test_libreoffice_calc_opens_a_sheet_on_the_sandboxs_display(tmp_path: Path) -> None:
    sandbox = LocalSandbox(LocalSandboxConfig(isolation="bwrap"), run_id="r", rollout_id="lo", root=tmp_path)
    await sandbox.start()
    try:
        await sandbox.write_file("sheet.csv", b"item,count\napples,3\n")
        sandbox.attach_gui(GuiSpec(url=None, start=(  # the filter's options: no import dialog
            "( soffice --calc --infilter='Text - txt - csv (StarCalc):44,34,UTF8' sheet.csv >/dev/null 2>&1 & )")))
        # the launcher runs the command once a first window shows (the splash, maybe): it waits for the sheet's
        got = await sandbox.exec(
            "for i in $(seq 300); do xdotool search --name '^sheet.csv - LibreOffice Calc$' getwindowname && exit 0; "
            "sleep 0.2; done; xdotool search --name . getwindowname %@ >&2; exit 1", timeout=180)
    finally:
        await sandbox.stop()
    assert (got.exit_code, got.stdout.strip()) == (0, "sheet.csv - LibreOffice Calc"), got.stderr[-800:]

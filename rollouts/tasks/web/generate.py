"""Writes the `builtin-web` task set (rollouts/tasks/web/tasks/builtin-web.jsonl):

    python -m openforge.rollouts.tasks.web.generate

Each task's reference `solution` drives the GUI for real, inside the sandbox: it clicks and types with
xdotool (through sandbox/gui.py, at $FORGE_GUI) at the coordinates the site's layout documents
(rollouts/tasks/web/sites.py), and waits until the page shows that the action took (a banner's or a
button's colour in a screenshot). State-graded tasks are graded by the site's state on the host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openforge.rollouts.tasks.web import WEB_TASKS_DIR
from openforge.rollouts.tasks.web.sites import COLOURS, OK_BANNER, Shop

G = '"$FORGE_PYTHON" -I "$FORGE_GUI"'
BANNER = f"{OK_BANNER[0]} {OK_BANNER[1]} {','.join(map(str, OK_BANNER[2]))}"
ON = "136,204,136"  # a chosen button's background (#8c8)
GREY = "128,128,128"
ANSWER = ".forge/answer.txt"
SCREEN_COLOURS = ("red", "blue")
SCREEN_INSTRUCTION = "What colour is the screen? Answer with one word: red or blue."


def sh(*steps: str) -> str:
    return " && ".join(["set -e", f"{G} wait-painted", *steps])


def click(x: int, y: int) -> str:
    return f"{G} click {x} {y}"


def typed(text: str) -> str:
    return f"{G} type '{text}'"


def answer(text: str) -> str:
    return f"mkdir -p .forge && printf '%s' '{text}' > {ANSWER}"


PRODUCTS = [
    {"sku": "mug-blue", "name": "Blue mug", "price": 8.50},
    {"sku": "lamp-desk", "name": "Desk lamp", "price": 24.00},
    {"sku": "mug-red", "name": "Red mug", "price": 6.25},
    {"sku": "lamp-floor", "name": "Floor lamp", "price": 17.25},
    {"sku": "mug-green", "name": "Green mug", "price": 7.00},
    {"sku": "kettle", "name": "Kettle", "price": 5.99},
]
ARTICLES = [
    {"slug": "velmora", "title": "Velmora", "facts": {"Type": "City", "Population": "212,000", "Founded": "1204"}},
    {"slug": "velmora-bridge", "title": "Velmora Harbour Bridge",
     "facts": {"Type": "Bridge", "Opened": "1931", "Length": "1,148 m", "Crosses": "Velmora Harbour"}},
    {"slug": "old-lighthouse", "title": "Old Lighthouse",
     "facts": {"Type": "Lighthouse", "Opened": "1887", "Height": "41 m"}},
    {"slug": "river-ost", "title": "River Ost", "facts": {"Type": "River", "Length": "310 km"}},
]
ROOMS = ["Sea room", "Garden room", "Tower room"]
SETTINGS = {"choices": {"theme": ["light", "dark"], "language": ["English", "Deutsch", "Français"],
                        "email notifications": ["on", "off"]},
            "initial": {"theme": "light", "language": "English", "email notifications": "on"}}


def _row_button(index: int) -> tuple[int, int]:
    return Shop.ADD_X + 100, Shop.ROW_Y + Shop.ROW_H * index + 25


def _setting(row: int, choice: int) -> tuple[int, int]:
    return 360 + 210 * choice + 100, 100 + 80 * row + 25


def web_tasks() -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    red = next(i for i, p in enumerate(PRODUCTS) if p["sku"] == "mug-red")
    x, y = _row_button(red)
    tasks.append({
        "id": "web-shop-cheapest-mug", "difficulty": "easy", "tags": ["web", "shop"],
        "instruction": "In the shop, add the cheapest mug to the cart (that one item only).",
        "gui": {"site": "shop", "params": {"products": PRODUCTS}, "expect_state": {"cart": ["mug-red"]}},
        "solution": sh(click(x, y), f"{G} wait-colour {BANNER}")})
    tasks.append({
        "id": "web-shop-cheapest-lamp-price", "difficulty": "easy", "tags": ["web", "shop"],
        "instruction": "What does the cheapest lamp in the shop cost? Answer with the price in dollars as a "
                       "number, e.g. 3.75.",
        "gui": {"site": "shop", "params": {"products": PRODUCTS}}, "expect_answer": {"number": 17.25},
        "solution": sh(answer("17.25"))})
    tasks.append({
        "id": "web-wiki-bridge-opened", "difficulty": "easy", "tags": ["web", "wiki"],
        "instruction": "According to the Little Wiki, in which year did the Velmora Harbour Bridge open? "
                       "Answer with the year only.",
        "gui": {"site": "wiki", "params": {"articles": ARTICLES}}, "expect_answer": {"number": 1931},
        "solution": sh(click(290, 100 + 70 * 1 + 25), f"{G} wait-colour {BANNER}", answer("1931"))})
    garden = ROOMS.index("Garden room")
    tasks.append({
        "id": "web-booking-garden-room", "difficulty": "medium", "tags": ["web", "booking"],
        "instruction": "Book the Garden room for Ada Lovelace on 2026-12-05 (date as YYYY-MM-DD).",
        "gui": {"site": "booking", "params": {"rooms": ROOMS},
                "expect_state": {"bookings": [{"name": "Ada Lovelace", "date": "2026-12-05", "room": "Garden room"}]}},
        "solution": sh(click(240, 140), typed("Ada Lovelace"), click(240, 240), typed("2026-12-05"),
                       click(40 + 220 * garden + 100, 345), click(140, 485), f"{G} wait-colour {BANNER}")})
    dark, off = _setting(0, 1), _setting(2, 1)
    tasks.append({
        "id": "web-settings-dark-no-email", "difficulty": "medium", "tags": ["web", "settings"],
        "instruction": "In the account settings, switch the theme to dark and turn email notifications off; "
                       "leave everything else as it is.",
        "gui": {"site": "settings", "params": SETTINGS, "expect_state": {
            "settings": {"theme": "dark", "language": "English", "email notifications": "off"}}},
        # a chosen option's button turns green once the page reloads with it saved
        "solution": sh(click(*dark), f"{G} wait-colour {dark[0] - 90} {dark[1]} {ON}",
                       click(*off), f"{G} wait-colour {off[0] - 90} {off[1]} {ON}")})
    tasks.append({
        "id": "desktop-editor-prefs", "difficulty": "medium", "tags": ["desktop", "settings"],
        "instruction": "In the Editor preferences window, set the font size to 16, turn word wrap on, and save.",
        "gui": {"site": "editor-prefs", "mode": "app", "params": {"font_size": 12, "word_wrap": False},
                "expect_state": {"prefs": {"font_size": 16, "word_wrap": True}}},
        "solution": sh(*[click(300, 130)] * 4, click(190, 230), click(140, 350), f"{G} wait-colour {BANNER}")})
    tasks.append({
        "id": "desktop-notes-write", "difficulty": "easy", "tags": ["desktop", "notes"],
        "instruction": "In the Notes app, write a note that says exactly: Water the plants at 6 -- then save it.",
        "gui": {"site": "notes", "mode": "app", "expect_state": {"notes": ["Water the plants at 6"]}},
        "solution": sh(click(490, 250), typed("Water the plants at 6"), click(140, 460), f"{G} wait-colour {BANNER}")})
    # gui-colour: the tiny VLM's family. Four quadrant buttons (a 2x2 grid: mini-gui --grid 2x2 cell n
    # is quadrant n); a click task per colour, with the colours in a different order each time.
    orders = [["red", "green", "blue", "yellow"], ["blue", "red", "yellow", "green"],
              ["green", "yellow", "red", "blue"], ["yellow", "blue", "green", "red"]]
    for colour, order in zip(COLOURS, orders):
        n = order.index(colour)
        cx, cy = 16 + 512 * (n % 2) + 240, 16 + 384 * (n // 2) + 176
        tasks.append({
            "id": f"gui-colour-click-{colour}", "difficulty": "easy", "tags": ["gui-colour", "web"],
            "instruction": f"Click the {colour} button.",
            "gui": {"site": "colour", "params": {"order": order}, "expect_state": {"clicks": [colour]}},
            "solution": sh(click(cx, cy), f"{G} wait-colour 512 384 {GREY}")})
    for colour in COLOURS:
        tasks.append({
            "id": f"gui-colour-name-{colour}", "difficulty": "easy", "tags": ["gui-colour", "web"],
            "instruction": "What colour is the square? Answer with one word: red, green, blue or yellow.",
            "gui": {"site": "colour", "params": {"square": colour}}, "expect_answer": {"words": colour},
            "solution": sh(answer(colour))})
    # gui-colour-screen: the whole screen one colour, two colours (a policy blind to the screenshot
    # scores at most 1/2): the mini-gui demo's tasks, which the tiny VLM learns to tell apart (docs/gui.md).
    for colour in SCREEN_COLOURS:
        tasks.append({
            "id": f"gui-colour-screen-{colour}", "difficulty": "easy", "tags": ["gui-colour-screen", "web"],
            "instruction": SCREEN_INSTRUCTION,
            "gui": {"site": "colour", "params": {"screen": colour}}, "expect_answer": {"words": colour},
            "solution": sh(answer(colour))})
    return tasks


def write(folder: Path = WEB_TASKS_DIR) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "builtin-web.jsonl"
    # each task's site is its web payload (TaskSpec.family, rollouts/tasks/web/payload.py)
    records = [{k: v for k, v in t.items() if k != "gui"} | {"family": {"kind": "web", "gui": t["gui"]}}
               for t in web_tasks()]
    path.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in records), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(write())

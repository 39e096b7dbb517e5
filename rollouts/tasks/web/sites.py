"""The small websites of the `builtin-web` task set: a shop, a wiki, a booking form, a settings page,
two desktop-style apps (an editor's preferences dialog, a notes app) and the coloured-buttons page.

Each site is a plain object: `handle(method, path, form)` answers one HTTP request (the site's own UI:
pages and form posts) and `state()` is what a grader reads. The state lives in the host process that
serves the site (rollouts/tasks/web/server.py); the sandbox reaches the site only over HTTP, so a policy can
change the state only through the actions the site offers, exactly as a user of the page could.

Layouts are absolute, in CSS pixels of a 1024x768 kiosk window (page pixels = screen pixels), with big
targets: the coordinates the reference solutions click are documented next to each page (`AT_*`).
"""

from __future__ import annotations

import html
import json
from typing import Any

Reply = tuple[int, str, str]  # status, content type, body (a 303's body is its Location)

_BASE_CSS = """body{margin:0;font:20px 'DejaVu Sans',sans-serif;background:#fff;color:#111}
.b{position:absolute;border:2px solid #333;background:#e8e8e8;font:20px 'DejaVu Sans',sans-serif;cursor:pointer}
.ok{position:absolute;left:0;top:0;width:1024px;height:60px;background:rgb(0,170,0);color:#fff;line-height:60px;
text-indent:20px}
.t{position:absolute;left:20px}
input.i{position:absolute;height:40px;width:400px;font:20px 'DejaVu Sans',sans-serif;border:2px solid #333}
a.l{position:absolute;left:40px;width:500px;height:50px;line-height:50px;background:#dde;text-decoration:none;
color:#00c;text-indent:12px}"""

OK_BANNER = (512, 30, (0, 170, 0))  # a point of the green banner a page shows after a successful action


def page(title: str, body: str, *, ok: str | None = None, script: str = "") -> Reply:
    banner = f'<div class="ok">{html.escape(ok)}</div>' if ok else ""
    doc = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{_BASE_CSS}</style></head><body>{banner}{body}{script}</body></html>")
    return 200, "text/html; charset=utf-8", doc


def redirect(location: str) -> Reply:
    return 303, "text/plain", location


def not_found() -> Reply:
    return 404, "text/plain; charset=utf-8", "not found"


def button(form_action: str, fields: dict[str, str], label: str, x: int, y: int, w: int = 200, h: int = 50,
           style: str = "") -> str:
    hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in fields.items())
    return (f'<form method="post" action="{form_action}">{hidden}<button class="b" type="submit" '
            f'style="left:{x}px;top:{y}px;width:{w}px;height:{h}px;{style}">{html.escape(label)}</button></form>')


class Site:
    name = ""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    def handle(self, method: str, path: str, form: dict[str, str]) -> Reply:  # pragma: no cover - abstract
        raise NotImplementedError

    def state(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError


# -- shop ---------------------------------------------------------------------------------------------
# Rows at y = 100 + 70*i; each row's "Add to cart" button spans x 760-960, y 100+70*i .. +50.

class Shop(Site):
    name = "shop"
    ROW_Y, ROW_H, ADD_X = 100, 70, 760

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.products: list[dict[str, Any]] = params["products"]  # {sku, name, price}
        self.cart: list[str] = []

    def handle(self, method: str, path: str, form: dict[str, str]) -> Reply:
        if method == "GET" and path == "/":
            rows = "".join(
                f'<div class="t" style="top:{self.ROW_Y + self.ROW_H * i + 12}px">{html.escape(p["name"])}</div>'
                f'<div class="t" style="left:520px;top:{self.ROW_Y + self.ROW_H * i + 12}px">${p["price"]:.2f}</div>'
                + button("/cart/add", {"sku": p["sku"]}, "Add to cart", self.ADD_X, self.ROW_Y + self.ROW_H * i)
                for i, p in enumerate(self.products))
            return page("Shop", f'<div class="t" style="top:30px;font-size:28px">Corner Shop</div>{rows}')
        if method == "POST" and path == "/cart/add":
            if form.get("sku") not in {p["sku"] for p in self.products}:
                return 400, "text/plain", "no such product"
            self.cart.append(form["sku"])
            return redirect("/cart")
        if method == "GET" and path == "/cart":
            names = {p["sku"]: p["name"] for p in self.products}
            items = "".join(f'<div class="t" style="top:{100 + 40 * i}px">{html.escape(names[s])}</div>'
                            for i, s in enumerate(self.cart))
            return page("Cart", items + '<a class="l" href="/" style="top:600px">Back to the shop</a>',
                        ok=f"Cart: {len(self.cart)} item(s)")
        return not_found()

    def state(self) -> dict[str, Any]:
        return {"cart": list(self.cart)}


# -- wiki ---------------------------------------------------------------------------------------------
# Index links at y = 100 + 70*i (x 40-540); an article shows its facts as "key: value" lines.

class Wiki(Site):
    name = "wiki"

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.articles: list[dict[str, Any]] = params["articles"]  # {slug, title, facts: {k: v}}
        self.visits: list[str] = []

    def handle(self, method: str, path: str, form: dict[str, str]) -> Reply:
        if method != "GET":
            return not_found()
        if path == "/":
            links = "".join(f'<a class="l" href="/a/{a["slug"]}" style="top:{100 + 70 * i}px">{html.escape(a["title"])}</a>'
                            for i, a in enumerate(self.articles))
            return page("Wiki", f'<div class="t" style="top:30px;font-size:28px">Little Wiki</div>{links}')
        for a in self.articles:
            if path == f"/a/{a['slug']}":
                self.visits.append(a["slug"])
                facts = "".join(f'<div class="t" style="top:{160 + 40 * i}px">{html.escape(k)}: {html.escape(str(v))}</div>'
                                for i, (k, v) in enumerate(a["facts"].items()))
                return page(a["title"], f'<div class="t" style="top:90px;font-size:28px">{html.escape(a["title"])}</div>'
                            f"{facts}", ok="Little Wiki")
        return not_found()

    def state(self) -> dict[str, Any]:
        return {"visits": list(self.visits)}


# -- booking ------------------------------------------------------------------------------------------
# Name field at (40..440, 120..160), date field at (40..440, 220..260), room buttons at y 320..370:
# x 40 + 220*i; "Book" at (40..240, 460..510). The page keeps the chosen room in a hidden field.

class Booking(Site):
    name = "booking"

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.rooms: list[str] = params["rooms"]
        self.bookings: list[dict[str, str]] = []

    def handle(self, method: str, path: str, form: dict[str, str]) -> Reply:
        if method == "GET" and path == "/":
            rooms = "".join(f'<button class="b" type="button" id="r{i}" style="left:{40 + 220 * i}px;top:320px;'
                            f'width:200px;height:50px" onclick="pick({i})">{html.escape(r)}</button>'
                            for i, r in enumerate(self.rooms))
            body = ('<div class="t" style="top:30px;font-size:28px">Book a room</div>'
                    '<form method="post" action="/book">'
                    '<div class="t" style="top:90px">Your name</div><input class="i" name="name" style="left:40px;top:120px">'
                    '<div class="t" style="top:190px">Date (YYYY-MM-DD)</div>'
                    '<input class="i" name="date" style="left:40px;top:220px">'
                    '<div class="t" style="top:290px">Room</div>'
                    f'<input type="hidden" name="room" id="room" value="">{rooms}'
                    '<button class="b" type="submit" style="left:40px;top:460px;width:200px;height:50px">Book</button>'
                    '</form>')
            script = ("<script>const rooms=" + json.dumps(self.rooms) + ";function pick(i){document.getElementById"
                      "('room').value=rooms[i];for(let j=0;j<rooms.length;j++){document.getElementById('r'+j)."
                      "style.background=j==i?'#8c8':'#e8e8e8'}}</script>")
            return page("Booking", body, script=script)
        if method == "POST" and path == "/book":
            name, date, room = (form.get(k, "").strip() for k in ("name", "date", "room"))
            if not name or not date or room not in self.rooms:
                return page("Booking", '<a class="l" href="/" style="top:120px">Back to the form</a>',
                            ok="Incomplete booking: name, date and room are required")
            self.bookings.append({"name": name, "date": date, "room": room})
            return page("Booked", f'<div class="t" style="top:120px">{html.escape(name)}: {html.escape(room)} on '
                        f'{html.escape(date)}</div>', ok="Booking confirmed")
        return not_found()

    def state(self) -> dict[str, Any]:
        return {"bookings": [dict(b) for b in self.bookings]}


# -- settings -----------------------------------------------------------------------------------------
# One row per setting at y = 100 + 80*i: its name at x 20, one button per choice at x 360 + 210*j.

class Settings(Site):
    name = "settings"

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.choices: dict[str, list[str]] = params["choices"]
        self.values: dict[str, str] = dict(params["initial"])

    def handle(self, method: str, path: str, form: dict[str, str]) -> Reply:
        if method == "GET" and path in ("/", "/saved"):
            rows = ""
            for i, (name, options) in enumerate(self.choices.items()):
                y = 100 + 80 * i
                rows += f'<div class="t" style="top:{y + 12}px">{html.escape(name)}</div>'
                for j, opt in enumerate(options):
                    on = self.values.get(name) == opt
                    rows += button("/set", {"name": name, "value": opt}, opt, 360 + 210 * j, y,
                                   style="background:#8c8" if on else "")
            return page("Settings", f'<div class="t" style="top:30px;font-size:28px">Account settings</div>{rows}'
                        if path == "/" else rows, ok="Saved" if path == "/saved" else None)
        if method == "POST" and path == "/set":
            name, value = form.get("name", ""), form.get("value", "")
            if value not in self.choices.get(name, []):
                return 400, "text/plain", "no such setting"
            self.values[name] = value
            return redirect("/saved")
        return not_found()

    def state(self) -> dict[str, Any]:
        return {"settings": dict(self.values)}


# -- desktop apps (chromium --app windows) -----------------------------------------------------------
# Editor preferences: "-" at (40..120, 100..160), "+" at (260..340, 100..160), the size shown between;
# "Word wrap" toggle at (40..340, 200..260); "Save" at (40..240, 320..380). Nothing is kept until Save.

class EditorPrefs(Site):
    name = "editor-prefs"

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.saved: dict[str, Any] = {"font_size": int(params.get("font_size", 12)),
                                      "word_wrap": bool(params.get("word_wrap", False))}
        self.saves = 0

    def handle(self, method: str, path: str, form: dict[str, str]) -> Reply:
        if method == "GET" and path in ("/", "/saved"):
            s = self.saved
            body = ('<form method="post" action="/save">'
                    f'<input type="hidden" name="font_size" id="fs" value="{s["font_size"]}">'
                    f'<input type="hidden" name="word_wrap" id="ww" value="{"on" if s["word_wrap"] else "off"}">'
                    '<div class="t" style="top:70px">Font size</div>'
                    '<button class="b" type="button" style="left:40px;top:100px;width:80px;height:60px" onclick="step(-1)">-</button>'
                    f'<div class="t" id="fsv" style="left:170px;top:115px">{s["font_size"]}</div>'
                    '<button class="b" type="button" style="left:260px;top:100px;width:80px;height:60px" onclick="step(1)">+</button>'
                    '<button class="b" type="button" id="wwb" style="left:40px;top:200px;width:300px;height:60px" '
                    f'onclick="wrap()">Word wrap: {"on" if s["word_wrap"] else "off"}</button>'
                    '<button class="b" type="submit" style="left:40px;top:320px;width:200px;height:60px">Save</button></form>')
            script = ("<script>function step(d){const f=document.getElementById('fs');const v=Math.max(6,Math.min(48,"
                      "parseInt(f.value)+d));f.value=v;document.getElementById('fsv').textContent=v}"
                      "function wrap(){const w=document.getElementById('ww');w.value=w.value=='on'?'off':'on';"
                      "document.getElementById('wwb').textContent='Word wrap: '+w.value}</script>")
            return page("Editor preferences", body, ok="Preferences saved" if path == "/saved" else None, script=script)
        if method == "POST" and path == "/save":
            try:
                size = int(form.get("font_size", ""))
            except ValueError:
                return 400, "text/plain", "bad font size"
            if not 6 <= size <= 48 or form.get("word_wrap") not in ("on", "off"):
                return 400, "text/plain", "bad preferences"
            self.saved = {"font_size": size, "word_wrap": form["word_wrap"] == "on"}
            self.saves += 1
            return redirect("/saved")
        return not_found()

    def state(self) -> dict[str, Any]:
        return {"prefs": dict(self.saved)}


# Notes: the text area at (40..940, 100..400); "Save note" at (40..240, 430..490).

class Notes(Site):
    name = "notes"

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.notes: list[str] = list(params.get("notes", []))

    def handle(self, method: str, path: str, form: dict[str, str]) -> Reply:
        if method == "GET" and path in ("/", "/saved"):
            listed = "".join(f'<div class="t" style="top:{520 + 36 * i}px">{html.escape(n)}</div>'
                             for i, n in enumerate(self.notes))
            body = ('<form method="post" action="/save"><textarea name="text" style="position:absolute;left:40px;'
                    'top:100px;width:900px;height:300px;font:20px \'DejaVu Sans\',sans-serif"></textarea>'
                    '<button class="b" type="submit" style="left:40px;top:430px;width:200px;height:60px">Save note'
                    f'</button></form>{listed}')
            return page("Notes", body, ok="Note saved" if path == "/saved" else None)
        if method == "POST" and path == "/save":
            text = form.get("text", "").strip()
            if text:
                self.notes.append(text[:1000])
            return redirect("/saved")
        return not_found()

    def state(self) -> dict[str, Any]:
        return {"notes": list(self.notes)}


# -- gui-colour: four big coloured buttons, one per quadrant (a 2x2 grid: cell n = quadrant n) ---------

COLOURS = {"red": (230, 0, 0), "green": (0, 170, 0), "blue": (0, 60, 230), "yellow": (240, 220, 0)}


class Colour(Site):
    name = "colour"

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.order: list[str] = params.get("order", list(COLOURS))  # quadrant n (reading order) -> colour
        self.square: str | None = params.get("square")  # set: one big square of that colour, no buttons
        self.screen: str | None = params.get("screen")  # set: the whole page that colour, nothing else
        self.clicks: list[str] = []

    def handle(self, method: str, path: str, form: dict[str, str]) -> Reply:
        if method == "GET" and path in ("/", "/clicked"):
            if self.screen:  # every pixel of the screenshot names the colour (the tiny VLM's demo task)
                r, g, b = COLOURS[self.screen]
                return page("Colour", f'<div style="position:fixed;inset:0;background:rgb({r},{g},{b})"></div>')
            if self.square:
                r, g, b = COLOURS[self.square]
                return page("Colour", f'<div style="position:absolute;left:312px;top:184px;width:400px;height:400px;'
                            f'background:rgb({r},{g},{b})"></div>')
            if path == "/clicked":  # a flat grey page: the click is done
                return page("Colour", '<div style="position:absolute;inset:0;background:rgb(128,128,128)"></div>')
            cells = ""
            for n, name in enumerate(self.order):
                r, g, b = COLOURS[name]
                cells += button("/click", {"colour": name}, "", 16 + 512 * (n % 2), 16 + 384 * (n // 2), 480, 352,
                                style=f"background:rgb({r},{g},{b});border:0")
            return page("Colour", cells)
        if method == "POST" and path == "/click" and not (self.square or self.screen):
            if form.get("colour") not in self.order:
                return 400, "text/plain", "no such button"
            self.clicks.append(form["colour"])
            return redirect("/clicked")
        return not_found()

    def state(self) -> dict[str, Any]:
        return {"clicks": list(self.clicks)}


SITES: dict[str, type[Site]] = {cls.name: cls for cls in (Shop, Wiki, Booking, Settings, EditorPrefs, Notes, Colour)}


def make_site(name: str, params: dict[str, Any]) -> Site:
    """The site `name` built from its params; ValueError for an unknown name (a KeyError from a site's own
    params, a missing one, is the caller's to report as bad params, not as an unknown site)."""
    if name not in SITES:
        raise ValueError(f"unknown site {name!r} (known: {', '.join(sorted(SITES))})")
    return SITES[name](params)

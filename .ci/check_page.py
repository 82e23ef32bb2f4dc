#!/usr/bin/env python3
"""Opens a page of ours (bitnet-bench's report page, bitnet-diff --format html) in headless
Chromium and checks what a reader gets.

Usage: check_page.py PAGE.html OUTDIR NAME TABLE SORT_COLUMN FILTER_COLUMN [REPORT.json]

- no console errors (uncaught exceptions or console.error) on any load;
- the table's cells after the page's script ran are the ones the page was written with (the
  script only reorders and hides rows); with REPORT.json, each row's pp, ttft and tg sort key
  is the report's median and the figure shown is it rounded, and a batch or context axis with
  several values is charted on log₂ with a tick at each value;
- `#sort=TABLE:COL:desc` (COL by name and by index) orders the rows by SORT_COLUMN, descending;
- `#filter=COL:VALUE` hides exactly the rows whose FILTER_COLUMN cell differs;
- every chart has labelled ticks (text in its SVG);
- every link to a file beside the page (JSON, CSV, charts, flamegraphs) reaches one;
- a screenshot of the page (OUTDIR/NAME.png) is kept as a CI artifact.
Clicks (sorting by a header, choosing a filter) are .ci/click_page.cjs's.
Exit 1 with what failed; 0 when every check holds.
"""
import html
import html.parser
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import urllib.parse

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


CONSOLE_ERRORS = []


def chromium(url, *extra):
    """Runs Chromium on url with a fresh profile: its stdout; console errors (uncaught
    exceptions, console.error) are collected in CONSOLE_ERRORS."""
    with tempfile.TemporaryDirectory() as profile:
        cmd = ["chromium", *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
               "--virtual-time-budget=5000", *extra, url]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        CONSOLE_ERRORS.extend(f"{url}: {l}" for l in p.stderr.splitlines()
                              if "CONSOLE" in l and ("Uncaught" in l or ":ERROR:" in l))
        return p.stdout


class Tables(html.parser.HTMLParser):
    """One table's rows (cells' text, sort keys, hidden) and each SVG's text count."""

    def __init__(self, table):
        super().__init__()
        self.table = table
        self.rows, self.svg_texts, self.svg_words = [], [], []
        self.in_table = self.in_cell = self.in_svg = self.in_text = False
        self.row = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("id") == self.table:
            self.in_table = True
        elif self.in_table and tag == "tr" and self.row is None:
            self.row = {"cells": [], "keys": [], "hidden": "hidden" in a}
        elif self.in_table and tag == "td" and self.row is not None:
            self.in_cell = True
            self.row["cells"].append("")
            self.row["keys"].append(a.get("data-v"))
        elif tag == "svg":
            self.in_svg = True
            self.svg_texts.append(0)
            self.svg_words.append([])
        elif tag == "text" and self.in_svg:
            self.svg_texts[-1] += 1
            self.in_text = True
            self.svg_words[-1].append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self.in_table = False
        elif tag == "td":
            self.in_cell = False
        elif tag == "tr" and self.row is not None:
            if self.row["cells"]:
                self.rows.append(self.row)
            self.row = None
        elif tag == "svg":
            self.in_svg = False
        elif tag == "text":
            self.in_text = False

    def handle_data(self, data):
        if self.in_cell and self.row is not None:
            self.row["cells"][-1] += data
        if self.in_text and self.svg_words:
            self.svg_words[-1][-1] += data


TABLE = "results"


def parse(text):
    t = Tables(TABLE)
    t.feed(text)
    return t


def main():
    global TABLE
    page, outdir, name = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]), sys.argv[3]
    TABLE, sort_name, filter_name = sys.argv[4], sys.argv[5], sys.argv[6]
    report = json.load(open(sys.argv[7])) if len(sys.argv) > 7 else None
    outdir.mkdir(parents=True, exist_ok=True)
    text = page.read_text()
    written = parse(text)
    failures = []
    head = text.split(f'id="{TABLE}"')[1].split("<thead>")[1].split("</thead>")[0]
    names = [h.split(">", 1)[1].split("<", 1)[0] for h in head.split("<th")[1:]]
    col = names.index(sort_name)

    loaded = parse(chromium(page.as_uri(), "--dump-dom"))
    if not loaded.rows:
        failures.append(f"no rows in table {TABLE}")
    if sorted(map(lambda r: r["cells"], loaded.rows)) != sorted(map(lambda r: r["cells"], written.rows)):
        failures.append("the table's cells after the script ran differ from the written ones")
    if report is not None:
        # Each statistic's sort key is the report's median, and the figure shown is that median
        # rounded (to the decimals it is written with).
        for col_name, get in [("pp", lambda r: r["prefill"]["tokens_per_sec"]), ("ttft", lambda r: r["prefill"]["ttft_ms"]),
                              ("tg", lambda r: r["decode"]["tokens_per_sec"])]:
            c = names.index(col_name)
            medians = sorted(get(r)["median"] for r in report["results"])
            keys = sorted(float(r["keys"][c]) for r in loaded.rows)
            if len(keys) != len(medians) or any(abs(k - m) > 1e-9 * abs(m) for k, m in zip(keys, medians)):
                failures.append(f"{col_name} sort keys {keys} are not the report's medians {medians}")
            for r in loaded.rows:
                shown = r["cells"][c].split(" ± ")[0]
                decimals = len(shown.split(".")[1]) if "." in shown else 0
                if abs(float(shown) - float(r["keys"][c])) > 0.5 * 10 ** -decimals + 1e-9:
                    failures.append(f"{col_name} shows {shown} for the median {r['keys'][c]}")
        # A batch or context axis with several values is drawn on log₂ with a tick at each.
        for what, label in [("batch", "batch size (log₂ scale)"), ("context_length", "context length (log₂ scale)")]:
            values = sorted({r["config"][what] for r in report["results"]})
            charts = [w for w in loaded.svg_words if label in w]
            if len(values) > 1 and (not charts or any(str(v) not in charts[0] for v in values)):
                failures.append(f"no chart of {what} on log₂ with a tick at each of {values}")
    if any(n < 3 for n in loaded.svg_texts):
        failures.append(f"a chart without labelled ticks (text elements per chart: {loaded.svg_texts})")

    # By name (what a shared address says) and by index.
    for how in (sort_name, col):
        dom = chromium(page.as_uri() + f"#sort={TABLE}:{how}:desc", "--dump-dom")
        order = [float(r["keys"][col]) for r in parse(dom).rows]
        if order != sorted(order, reverse=True):
            failures.append(f"#sort={TABLE}:{how}:desc left {sort_name} in the order {order}")

    fcol = names.index(filter_name)
    value = written.rows[0]["cells"][fcol] if written.rows else ""
    dom = chromium(page.as_uri() + f"#filter={filter_name}:{value}", "--dump-dom")
    rows = parse(dom).rows
    wrong = [r["cells"][fcol] for r in rows if r["hidden"] == (r["cells"][fcol] == value)]
    if wrong or not rows:
        failures.append(f"#filter={filter_name}:{value} showed or hid the wrong rows ({wrong})")

    # As a browser resolves them: entities, then percent-encoding.
    hrefs = [urllib.parse.unquote(html.unescape(h.split('"', 1)[0])) for h in text.split('href="')[1:]]
    local = [h for h in hrefs if "://" not in h and not h.startswith("#")]
    missing = [h for h in local if not (page.parent / h).is_file()]
    if missing:
        failures.append(f"links to missing files: {missing}")

    shot = outdir / (name + ".png")
    chromium(page.as_uri(), f"--screenshot={shot}", "--window-size=1280,1800", "--hide-scrollbars")
    if not shot.exists() or shot.stat().st_size < 10_000:
        failures.append(f"no screenshot at {shot}")
    if CONSOLE_ERRORS:
        failures.append("console errors: " + " | ".join(CONSOLE_ERRORS[:5]))

    for f in failures:
        print(f"check_page: {page}: {f}", file=sys.stderr)
    if not failures:
        print(f"check_page: {page}: {len(loaded.rows)} rows, {len(loaded.svg_texts)} charts, {len(local)} links reach their "
              f"files, #sort and #filter work, no console errors; screenshot {shot}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

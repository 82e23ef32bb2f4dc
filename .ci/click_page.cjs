// Clicks through a page of ours in Debian's Chromium, driven by Playwright (playwright-core
// from npm, no browser download), as a reader would:
//
//   node .ci/click_page.cjs NODE_MODULES PAGE.html TABLE SORT_COLUMN FILTER_COLUMN
//
// - no console errors or uncaught exceptions;
// - clicking SORT_COLUMN's header orders the rows by it, ascending, and a second click
//   descending (the header's aria-sort says which);
// - choosing the first value in FILTER_COLUMN's filter shows exactly the rows with that value,
//   and "all" shows every row again;
// - every chart mark a reader can point at (bars, points) has its hover text (an SVG <title>).
// Exit 1 with what failed; 0 when every check holds.
const path = require("path");
const url = require("url");
const { execSync } = require("child_process");

const [modules, page, table, sortName, filterName] = process.argv.slice(2);
const { chromium } = require(path.join(path.resolve(modules), "playwright-core"));

async function main() {
  const failures = [];
  const browser = await chromium.launch({
    executablePath: execSync("command -v chromium", { shell: "/bin/sh" }).toString().trim(),
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
      "--disable-sync", "--no-first-run"],
  });
  const tab = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  tab.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  tab.on("pageerror", (e) => errors.push(String(e)));
  await tab.goto(url.pathToFileURL(path.resolve(page)).href);

  const names = await tab.$$eval(`#${table} thead th`, (ths) => ths.map((th) => th.firstChild.textContent.trim()));
  const col = names.indexOf(sortName);
  const fcol = names.indexOf(filterName);
  if (col < 0 || fcol < 0) failures.push(`columns ${sortName}/${filterName} not in ${names}`);
  const keys = () => tab.$$eval(`#${table} tbody tr`, (rows, c) => rows.map((r) => {
    const v = r.cells[c].getAttribute("data-v");
    return v === null ? r.cells[c].textContent : parseFloat(v);
  }), col);
  const header = tab.locator(`#${table} thead th`).nth(col);
  for (const [order, cmp] of [["ascending", (a, b) => a <= b], ["descending", (a, b) => a >= b]]) {
    await header.click();
    const k = await keys();
    const sorted = k.every((v, i) => i === 0 || cmp(k[i - 1], v));
    const aria = await header.getAttribute("aria-sort");
    if (!sorted || aria !== order) failures.push(`click on ${sortName}: ${aria}, keys ${JSON.stringify(k)}, want ${order}`);
  }

  const select = tab.locator(`.filters[data-table=${table}] select[data-col="${fcol}"]`);
  const values = await select.locator("option").allTextContents();
  if (values.length < 2) failures.push(`filter ${filterName} offers no values: ${values}`);
  const visible = () => tab.$$eval(`#${table} tbody tr`, (rows, c) => rows.map((r) => [r.cells[c].textContent, !r.hidden]), fcol);
  await select.selectOption(values[1]);
  const shown = await visible();
  const wrong = shown.filter(([text, on]) => on !== (text === values[1]));
  if (wrong.length || !shown.some(([, on]) => on)) failures.push(`filter ${filterName}=${values[1]} showed or hid ${JSON.stringify(wrong)}`);
  await select.selectOption("");
  if ((await visible()).some(([, on]) => !on)) failures.push(`filter ${filterName}=all left rows hidden`);

  const marks = await tab.$$eval("figure svg", (svgs) => svgs.map((s) => {
    const m = [...s.querySelectorAll("circle, rect[height]")].filter((e) => e.getAttribute("width") !== "12" && e !== s.querySelector("rect"));
    return [m.length, m.filter((e) => e.querySelector("title")).length];
  }));
  marks.forEach(([n, titled], i) => { if (n === 0 || titled !== n) failures.push(`chart ${i}: ${titled} of ${n} marks have hover text`); });

  if (errors.length) failures.push("console errors: " + errors.slice(0, 5).join(" | "));
  await browser.close();
  for (const f of failures) console.error(`click_page: ${page}: ${f}`);
  if (!failures.length) {
    console.log(`click_page: ${page}: sorting by ${sortName} and filtering by ${filterName} by click work, ${marks.length} charts with hover text on every mark, no console errors`);
  }
  process.exit(failures.length ? 1 : 0);
}

main().catch((e) => { console.error(`click_page: ${page}: ${e}`); process.exit(1); });

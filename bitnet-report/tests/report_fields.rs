//! reports/README.md's field reference is the schema's, made by `report_fields`: a field added,
//! removed or redocumented in the `Report` type shows here until the page is regenerated
//! (`UPDATE_GOLDEN=1 cargo test -p bitnet-report --test report_fields`).

use bitnet_report::{report, report_fields};

const BEGIN: &str = "<!-- Generated from the schema by `UPDATE_GOLDEN=1 cargo test -p bitnet-report --test report_fields`: do not edit below by hand. -->\n";

#[test]
fn the_readme_field_reference_is_the_schemas() {
    let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../reports/README.md"));
    let readme = std::fs::read_to_string(path).unwrap();
    let schema: serde_json::Value = serde_json::from_str(&report::schema_json()).unwrap();
    let want = report_fields::fields_markdown(&schema);
    let at = readme.find(BEGIN).map(|i| i + BEGIN.len());
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        let head = match at {
            Some(i) => readme[..i].to_string(),
            None => format!("{}\n{BEGIN}\n", readme.trim_end()),
        };
        std::fs::write(path, format!("{head}\n{want}").trim_end().to_string() + "\n").unwrap();
        return;
    }
    let at =
        at.unwrap_or_else(|| panic!("reports/README.md has no generated field reference (UPDATE_GOLDEN=1 adds it)"));
    assert_eq!(
        readme[at..].trim(),
        want.trim(),
        "reports/README.md's fields differ from the schema's; rerun with UPDATE_GOLDEN=1 and review the diff"
    );
}

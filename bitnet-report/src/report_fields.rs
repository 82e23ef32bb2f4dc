//! The report's field reference (`reports/README.md`, section "Fields") as Markdown tables
//! made from the JSON Schema, so that the page says what the schema says and cannot drift from
//! it: one section per object type, in the order they are first reached from `Report`, one row
//! per field (in the schema's key order, alphabetical) with its type (`(optional)` where the schema does not require it) and its doc
//! comment.

use serde_json::Value;

/// The Markdown of every object type in `schema` (a schema as [`crate::report::schema_json`]
/// prints it).
pub fn fields_markdown(schema: &Value) -> String {
    let defs = schema.get("$defs").and_then(Value::as_object);
    let mut order = vec![("Report".to_string(), schema)];
    let mut i = 0;
    while i < order.len() {
        let (_, obj) = order[i];
        for name in refs_in(obj) {
            if !order.iter().any(|(n, _)| *n == name) {
                if let Some(d) = defs.and_then(|d| d.get(&name)) {
                    order.push((name, d));
                }
            }
        }
        i += 1;
    }
    let mut out = String::new();
    for (name, obj) in order {
        let Some(props) = obj.get("properties").and_then(Value::as_object) else { continue };
        out.push_str(&format!("### `{name}`\n\n"));
        if let Some(d) = obj.get("description").and_then(Value::as_str) {
            out.push_str(&format!("{}\n\n", one_line(d)));
        }
        out.push_str("| field | type | meaning |\n|---|---|---|\n");
        let required: Vec<&str> =
            obj.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        for (field, p) in props {
            let ty = type_of(p) + if required.contains(&field.as_str()) { "" } else { " (optional)" };
            // A field that is a plain reference documents itself through its type's description.
            let referenced =
                p.get("$ref").and_then(Value::as_str).and_then(|r| defs?.get(r.trim_start_matches("#/$defs/")));
            let meaning = p
                .get("description")
                .or_else(|| referenced.and_then(|d| d.get("description")))
                .and_then(Value::as_str)
                .map(one_line)
                .unwrap_or_default();
            out.push_str(&format!("| `{field}` | {ty} | {} |\n", meaning.replace('|', "\\|")));
        }
        out.push('\n');
    }
    out
}

/// Object types a schema node refers to, in order of appearance.
fn refs_in(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut walk = vec![v];
    while let Some(n) = walk.pop() {
        match n {
            Value::Object(m) => {
                if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                    out.push(r.trim_start_matches("#/$defs/").to_string());
                }
                // `$defs` are reached through references, not by walking into them.
                walk.extend(m.iter().filter(|(k, _)| *k != "$defs").map(|(_, v)| v).rev());
            }
            Value::Array(a) => walk.extend(a.iter().rev()),
            _ => {}
        }
    }
    out
}

/// A field's type as a reader says it: `integer`, `Stat`, `array of number`, `Quality or null`.
fn type_of(p: &Value) -> String {
    if let Some(r) = p.get("$ref").and_then(Value::as_str) {
        return r.trim_start_matches("#/$defs/").to_string();
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(alts) = p.get(key).and_then(Value::as_array) {
            return alts.iter().map(type_of).collect::<Vec<_>>().join(" or ");
        }
    }
    if let Some(all) = p.get("allOf").and_then(Value::as_array) {
        return all.iter().map(type_of).collect::<Vec<_>>().join(" and ");
    }
    match p.get("type") {
        Some(Value::Array(ts)) => {
            ts.iter().map(|t| named(t.as_str().unwrap_or("?"), p)).collect::<Vec<_>>().join(" or ")
        }
        Some(Value::String(t)) => named(t, p),
        _ if p.as_bool() == Some(true) || p.as_object().is_some_and(|m| m.is_empty()) => "any".into(),
        _ => "any".into(),
    }
}

fn named(t: &str, p: &Value) -> String {
    match t {
        "array" => format!("array of {}", p.get("items").map(type_of).unwrap_or_else(|| "any".into())),
        "object" => match p.get("additionalProperties") {
            Some(v) if v.is_object() => format!("map of {}", type_of(v)),
            _ => "object".into(),
        },
        other => other.into(),
    }
}

/// Doc comments wrap at 100 columns; a table cell is one line.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_optional_fields_and_reference_order() {
        let schema = serde_json::json!({
            "title": "Report",
            "description": "Top.",
            "properties": {
                "b": { "$ref": "#/$defs/B", "description": "A B\nwrapped." },
                "n": { "type": ["integer", "null"] },
                "xs": { "type": "array", "items": { "type": "number" }, "description": "a | b" },
                "q": { "anyOf": [{ "$ref": "#/$defs/Q" }, { "type": "null" }] },
                "r": { "$ref": "#/$defs/B" }
            },
            "required": ["b", "xs"],
            "$defs": {
                "Q": { "properties": { "v": { "type": "number" } }, "required": ["v"] },
                "B": { "description": "Bee.", "properties": { "m": { "type": "object", "additionalProperties": { "$ref": "#/$defs/Q" } } } }
            }
        });
        let md = fields_markdown(&schema);
        let want = "### `Report`\n\nTop.\n\n| field | type | meaning |\n|---|---|---|\n\
            | `b` | B | A B wrapped. |\n| `n` | integer or null (optional) |  |\n\
            | `q` | Q or null (optional) |  |\n| `r` | B (optional) | Bee. |\n| `xs` | array of number | a \\| b |\n\n\
            ### `B`\n\nBee.\n\n| field | type | meaning |\n|---|---|---|\n| `m` | map of Q (optional) |  |\n\n\
            ### `Q`\n\n| field | type | meaning |\n|---|---|---|\n| `v` | number |  |\n\n";
        assert_eq!(md, want);
    }
}

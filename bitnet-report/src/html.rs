//! Self-contained HTML pages in one style, for the sweep's report page and the diff's: inline
//! CSS and a small inline script, nothing fetched, so a page opens offline and in a CI artifact
//! viewer. Tables are made to be read: column names with units, numbers rounded to what their
//! confidence interval supports, sortable by any column (click a header, or
//! `#sort=TABLE:COLUMN:desc` in the address), filterable by the columns marked so (or
//! `#filter=COLUMN:VALUE`), scrolling inside their own box. The address forms make a view
//! shareable, and let a headless browser check sorting and filtering without clicks.

use std::fmt::Write;

/// Text made safe for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Decimals that show a confidence interval's half-width `hw` to two significant digits (0 to
/// 6); `None` where there is no interval (one sample, or not finite).
pub fn ci_decimals(hw: f64) -> Option<usize> {
    (hw.is_finite() && hw > 0.0).then(|| (1 - hw.log10().floor() as i64).clamp(0, 6) as usize)
}

/// `v` to `digits` significant digits, without an exponent (`984.9`, `0.01234`, `12345`).
pub fn significant(v: f64, digits: usize) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let d = (digits as i64 - 1 - v.abs().log10().floor() as i64).clamp(0, 9) as usize;
    format!("{v:.d$}")
}

/// A value and the half-width of its 95% interval, both rounded to the interval's second
/// significant digit: `985 ± 12`, `16.252 ± 0.013`; a value without an interval to four
/// significant digits.
pub fn with_ci(v: f64, lo: f64, hi: f64) -> String {
    let hw = (hi - lo) / 2.0;
    match ci_decimals(hw) {
        Some(d) => format!("{v:.d$} ± {hw:.d$}"),
        None => significant(v, 4),
    }
}

/// One cell: what it shows, the number it sorts by (text sorts as text), a tooltip, and where
/// its text links to.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub text: String,
    pub sort: Option<f64>,
    pub title: Option<String>,
    pub href: Option<String>,
}

impl Cell {
    pub fn text(s: impl Into<String>) -> Cell {
        Cell { text: s.into(), sort: None, title: None, href: None }
    }
    /// A number shown as `text`, sorted by `v`.
    pub fn number(v: f64, text: impl Into<String>) -> Cell {
        Cell { text: text.into(), sort: Some(v), title: None, href: None }
    }
    /// No value: shown as `-`, sorted first.
    pub fn none() -> Cell {
        Cell { text: "-".into(), sort: Some(f64::NEG_INFINITY), title: None, href: None }
    }
    pub fn titled(mut self, title: impl Into<String>) -> Cell {
        self.title = Some(title.into());
        self
    }
    /// The cell's text as a link to `href` (relative to the page).
    pub fn linked(mut self, href: impl Into<String>) -> Cell {
        self.href = Some(href.into());
        self
    }
}

/// A column: its name, its unit (shown under the name), what it is (the header's tooltip),
/// and whether the page offers a filter by its values.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub name: String,
    pub unit: String,
    pub help: String,
    pub numeric: bool,
    pub filter: bool,
    /// Said once above the table when every row has the same value ([`Table::hoist_constant`]).
    pub hoist: bool,
}

impl Column {
    pub fn new(name: &str, unit: &str, help: &str) -> Column {
        Column {
            name: name.into(),
            unit: unit.into(),
            help: help.into(),
            numeric: !unit.is_empty(),
            filter: false,
            hoist: false,
        }
    }
    /// A column of counts (threads, batch): numeric, without a unit.
    pub fn count(name: &str, help: &str) -> Column {
        Column { name: name.into(), unit: String::new(), help: help.into(), numeric: true, filter: false, hoist: false }
    }
    /// A column of labels, sorted as text.
    pub fn label(name: &str, help: &str) -> Column {
        Column {
            name: name.into(),
            unit: String::new(),
            help: help.into(),
            numeric: false,
            filter: false,
            hoist: false,
        }
    }
    /// Offers a filter by this column's values.
    pub fn filtered(mut self) -> Column {
        self.filter = true;
        self
    }
    /// Said once above the table instead when every row has the same value.
    pub fn hoisted(mut self) -> Column {
        self.hoist = true;
        self
    }
}

/// A sortable, filterable table.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// The table's id (`#sort=ID:…` names it).
    pub id: String,
    pub columns: Vec<Column>,
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    /// Takes out the [`Column::hoisted`] columns whose cells all read the same (with more than
    /// one row), returning each one's name and text, so that a page can say them once above
    /// the table instead of repeating them on every row.
    pub fn hoist_constant(&mut self) -> Vec<(String, String)> {
        let same = |i: usize| {
            self.rows.len() > 1
                && self.rows.iter().all(|r| r.get(i).map(|c| &c.text) == self.rows[0].get(i).map(|c| &c.text))
        };
        let hoisted: Vec<usize> = (0..self.columns.len()).filter(|&i| self.columns[i].hoist && same(i)).collect();
        let out = hoisted.iter().map(|&i| (self.columns[i].name.clone(), self.rows[0][i].text.clone())).collect();
        for &i in hoisted.iter().rev() {
            self.columns.remove(i);
            for r in &mut self.rows {
                r.remove(i);
            }
        }
        out
    }

    /// The filters (one select per filtered column, listing its values in order of first
    /// appearance), then the table in a box that scrolls sideways when it is wider than the page.
    pub fn to_html(&self) -> String {
        let mut o = String::new();
        let filters: Vec<(usize, &Column)> = self.columns.iter().enumerate().filter(|(_, c)| c.filter).collect();
        if !filters.is_empty() {
            let _ = write!(o, "<div class=\"filters\" data-table=\"{}\">", escape(&self.id));
            for (i, c) in filters {
                let mut values: Vec<&str> = Vec::new();
                for r in &self.rows {
                    if let Some(cell) = r.get(i) {
                        if !values.contains(&cell.text.as_str()) {
                            values.push(&cell.text);
                        }
                    }
                }
                let _ =
                    write!(o, "<label>{} <select data-col=\"{i}\"><option value=\"\">all</option>", escape(&c.name));
                for v in values {
                    let _ = write!(o, "<option>{}</option>", escape(v));
                }
                o.push_str("</select></label>");
            }
            o.push_str("</div>\n");
        }
        let _ = write!(o, "<div class=\"scroll\"><table class=\"sortable\" id=\"{}\">\n<thead><tr>", escape(&self.id));
        for c in &self.columns {
            let class = if c.numeric { " class=\"num\"" } else { "" };
            let unit =
                if c.unit.is_empty() { String::new() } else { format!("<br><small>{}</small>", escape(&c.unit)) };
            let _ =
                write!(o, "<th{class} title=\"{}\" aria-sort=\"none\">{}{unit}</th>", escape(&c.help), escape(&c.name));
        }
        o.push_str("</tr></thead>\n<tbody>\n");
        for r in &self.rows {
            o.push_str("<tr>");
            for (c, cell) in self.columns.iter().zip(r) {
                let class = if c.numeric { " class=\"num\"" } else { "" };
                let sort = cell.sort.map_or(String::new(), |v| format!(" data-v=\"{}\"", sort_key(v)));
                let title = cell.title.as_ref().map_or(String::new(), |t| format!(" title=\"{}\"", escape(t)));
                let text = match &cell.href {
                    Some(h) => format!("<a href=\"{}\">{}</a>", escape(h), escape(&cell.text)),
                    None => escape(&cell.text),
                };
                let _ = write!(o, "<td{class}{sort}{title}>{text}</td>");
            }
            o.push_str("</tr>\n");
        }
        o.push_str("</tbody></table></div>\n");
        o
    }
}

/// A sort key the script's `parseFloat` reads back, infinities included.
fn sort_key(v: f64) -> String {
    if v == f64::NEG_INFINITY {
        "-Infinity".into()
    } else if v == f64::INFINITY {
        "Infinity".into()
    } else {
        format!("{v}")
    }
}

const STYLE: &str =
    "body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1200px;padding:0 16px;color:#222}\
h1{font-size:22px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 8px}\
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;font-size:14px;margin:8px 0}\
dl.meta dt{color:#555}dl.meta dd{margin:0}\
.note{border-left:4px solid #d9822b;background:#fff6ea;padding:6px 10px;margin:6px 0;font-size:14px}\
.filters{font-size:13px;margin:8px 0}.filters label{margin-right:14px}\
.scroll{overflow-x:auto;max-width:100%;border:1px solid #ddd}\
table{border-collapse:collapse;font-size:13px;white-space:nowrap}\
th,td{border-bottom:1px solid #e4e4e4;padding:4px 8px;text-align:left}\
th{background:#f5f5f5;cursor:pointer;vertical-align:bottom;position:sticky;top:0;white-space:normal;min-width:3em}\
th small{color:#666;font-weight:normal}.num{text-align:right;font-variant-numeric:tabular-nums}\
th[aria-sort=ascending]::after{content:' \\25B2'}th[aria-sort=descending]::after{content:' \\25BC'}\
tbody tr:hover{background:#f0f6ff}figure{margin:24px 0}figcaption{font-weight:600;margin-bottom:6px}figure svg{max-width:100%;height:auto}figure svg text.title{display:none}\
.links a{margin-right:14px}p.legend{font-size:13px;color:#444}p.shared{font-size:14px;margin:6px 0}";

/// Sorting (click a header; `#sort=TABLE:COLUMN[:desc]` on load) and filtering (the selects
/// above a table hide the rows whose cell differs; `#filter=COLUMN:VALUE` on load); COLUMN is
/// a column's name (`tg`) or its index.
const SCRIPT: &str = r#"(function(){
function colOf(t,c){if(/^\d+$/.test(c))return +c;var h=t.tHead.rows[0].cells;for(var i=0;i<h.length;i++){if(h[i].firstChild.textContent===c)return i;}return -1;}
function key(td){var v=td.getAttribute('data-v');return v===null?td.textContent:parseFloat(v);}
function sortBy(t,col,desc){var tb=t.tBodies[0],rows=Array.prototype.slice.call(tb.rows);
rows.sort(function(a,b){var x=key(a.cells[col]),y=key(b.cells[col]);
var c=(typeof x==='number'&&typeof y==='number')?(x<y?-1:x>y?1:0):String(x).localeCompare(String(y));return desc?-c:c;});
rows.forEach(function(r){tb.appendChild(r);});
Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th,i){th.setAttribute('aria-sort',i===col?(desc?'descending':'ascending'):'none');});}
document.querySelectorAll('table.sortable').forEach(function(t){
Array.prototype.forEach.call(t.tHead.rows[0].cells,function(th,i){th.addEventListener('click',function(){sortBy(t,i,th.getAttribute('aria-sort')==='ascending');});});});
document.querySelectorAll('.filters').forEach(function(f){var t=document.getElementById(f.getAttribute('data-table'));if(!t)return;
var sels=f.querySelectorAll('select');function apply(){Array.prototype.forEach.call(t.tBodies[0].rows,function(r){var show=true;
sels.forEach(function(s){var c=+s.getAttribute('data-col');if(s.value!==''&&r.cells[c].textContent!==s.value)show=false;});r.hidden=!show;});}
sels.forEach(function(s){s.addEventListener('change',apply);});
var fm=/filter=([^:&]+):([^&]*)/.exec(location.hash);if(fm){var fc=colOf(t,decodeURIComponent(fm[1]));sels.forEach(function(s){if(+s.getAttribute('data-col')===fc)s.value=decodeURIComponent(fm[2]);});apply();}});
var m=/sort=([^:&]+):([^:&]+)(:desc)?/.exec(location.hash);if(m){var t=document.getElementById(decodeURIComponent(m[1]));if(t){var c=colOf(t,decodeURIComponent(m[2]));if(c>=0)sortBy(t,c,!!m[3]);}}
})();"#;

/// A page: `title`, then `body` (already HTML), with the style and the script inline.
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{}</title>\n<style>{STYLE}</style></head>\n<body>\n{body}<script>{SCRIPT}</script>\n</body></html>\n",
        escape(title)
    )
}

/// A definition list of (term, description) pairs, descriptions as HTML.
pub fn meta(items: &[(&str, String)]) -> String {
    let mut o = String::from("<dl class=\"meta\">\n");
    for (k, v) in items {
        let _ = writeln!(o, "<dt>{}</dt><dd>{v}</dd>", escape(k));
    }
    o.push_str("</dl>\n");
    o
}

/// A visible note (a warning a reader must not miss).
pub fn note(text: &str) -> String {
    format!("<p class=\"note\">{}</p>\n", escape(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_rounded_to_what_their_interval_supports() {
        assert_eq!(with_ci(984.9473030606498, 972.6, 997.2), "985 ± 12");
        assert_eq!(with_ci(16.252275500000003, 16.2392, 16.2652), "16.252 ± 0.013");
        assert_eq!(with_ci(1.5, 1.4, 1.6), "1.50 ± 0.10");
        // One sample: no interval, four significant digits.
        assert_eq!(with_ci(984.9473030606498, 984.9473030606498, 984.9473030606498), "984.9");
        assert_eq!(significant(0.012345, 3), "0.0123");
        assert_eq!(significant(123456.0, 3), "123456");
        assert_eq!(ci_decimals(0.0), None);
        assert_eq!(ci_decimals(f64::NAN), None);
    }

    #[test]
    fn tables_escape_their_text_and_carry_sort_keys() {
        let t = Table {
            id: "r".into(),
            columns: vec![Column::label("kernel", "the kernel").filtered(), Column::new("tg", "tokens/s", "decode")],
            rows: vec![
                vec![Cell::text("i2s<1>"), Cell::number(12.5, "12.5 ± 0.2")],
                vec![Cell::text("tq2"), Cell::none()],
            ],
        };
        let h = t.to_html();
        assert!(
            h.contains("<td>i2s&lt;1&gt;</td>") && h.contains("data-v=\"12.5\"") && h.contains("data-v=\"-Infinity\"")
        );
        assert!(h.contains("<option>i2s&lt;1&gt;</option><option>tq2</option>"), "{h}");
        assert!(h.contains("<th class=\"num\" title=\"decode\" aria-sort=\"none\">tg<br><small>tokens/s</small></th>"));
        let p = page("a <b>", &h);
        assert!(p.starts_with("<!doctype html>") && p.contains("<title>a &lt;b&gt;</title>") && !p.contains("http"));
        assert!(!p.contains("<link") && !p.contains("src="), "nothing fetched");
    }

    #[test]
    fn constant_columns_are_hoisted_and_the_rest_keep_their_cells() {
        let mut t = Table {
            id: "t".into(),
            columns: vec![
                Column::label("model", "").hoisted(),
                Column::count("batch", "").hoisted(),
                Column::label("kv", "").hoisted(),
                Column::new("tg", "t/s", ""),
            ],
            rows: [("1", "f16", "10"), ("4", "f16", "20"), ("1", "f16", "10")]
                .iter()
                .map(|(b, kv, tg)| vec![Cell::text("m"), Cell::text(*b), Cell::text(*kv), Cell::number(1.0, *tg)])
                .collect(),
        };
        // tg is the same in two rows only, and not a hoisted column anyway.
        assert_eq!(t.hoist_constant(), vec![("model".into(), "m".into()), ("kv".into(), "f16".into())]);
        assert_eq!(t.columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["batch", "tg"]);
        assert_eq!(t.rows[1].iter().map(|c| c.text.as_str()).collect::<Vec<_>>(), ["4", "20"]);
        // One row: nothing is hoisted (the row itself says it).
        let mut one = Table { id: "o".into(), columns: t.columns.clone(), rows: vec![t.rows[0].clone()] };
        assert!(one.hoist_constant().is_empty() && one.columns.len() == 2);
    }
}

//! List flags as llama-bench takes them: values separated by spaces or commas, and ranges
//! `first-last` (step 1), `first-last+step` and `first-last*factor`.

use anyhow::{bail, Context, Result};

/// Expands one flag's values: each item may itself hold commas and ranges.
pub fn parse_usize_list(flag: &str, items: &[String]) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for item in items {
        for part in item.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            out.extend(expand(part).with_context(|| format!("{flag} {part}"))?);
        }
    }
    if out.is_empty() {
        bail!("{flag}: needs at least one value");
    }
    if let Some(z) = out.iter().find(|v| **v == 0) {
        bail!("{flag}: {z} is not allowed; sizes must be at least 1");
    }
    Ok(out)
}

fn num(s: &str) -> Result<usize> {
    s.parse::<usize>().with_context(|| format!("expected a non-negative whole number, got {s:?}"))
}

fn expand(part: &str) -> Result<Vec<usize>> {
    let Some((first, rest)) = part.split_once('-') else {
        return Ok(vec![num(part)?]);
    };
    let first = num(first)?;
    let (last, step): (usize, Box<dyn Fn(usize) -> usize>) = if let Some((l, f)) = rest.split_once('*') {
        let f = num(f)?;
        if f < 2 {
            bail!("a range factor must be at least 2");
        }
        (num(l)?, Box::new(move |v| v * f))
    } else if let Some((l, s)) = rest.split_once('+') {
        let s = num(s)?;
        if s == 0 {
            bail!("a range step must be at least 1");
        }
        (num(l)?, Box::new(move |v| v + s))
    } else {
        (num(rest)?, Box::new(|v| v + 1))
    };
    if last < first {
        bail!("range end {last} is below its start {first}");
    }
    if first == 0 && rest.contains('*') {
        bail!("a multiplicative range cannot start at 0");
    }
    let mut v = Vec::new();
    let mut x = first;
    while x <= last {
        v.push(x);
        if v.len() > 10_000 {
            bail!("range has more than 10000 values");
        }
        x = step(x);
    }
    Ok(v)
}

/// Expands a list of names (spaces or commas) and parses each.
pub fn parse_list<T: std::str::FromStr>(flag: &str, items: &[String]) -> Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    let mut out = Vec::new();
    for item in items {
        for part in item.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            out.push(part.parse::<T>().map_err(|e| anyhow::anyhow!("{flag} {part}: {e}"))?);
        }
    }
    if out.is_empty() {
        bail!("{flag}: needs at least one value");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &[&str]) -> Result<Vec<usize>> {
        parse_usize_list("--batch-sizes", &s.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn spaces_commas_and_ranges() {
        assert_eq!(p(&["1", "4", "8"]).unwrap(), [1, 4, 8]);
        assert_eq!(p(&["1,4", "8"]).unwrap(), [1, 4, 8]);
        assert_eq!(p(&["1-16*2"]).unwrap(), [1, 2, 4, 8, 16]);
        assert_eq!(p(&["128-512+128"]).unwrap(), [128, 256, 384, 512]);
        assert_eq!(p(&["2-4"]).unwrap(), [2, 3, 4]);
    }

    #[test]
    fn bad_values_name_the_flag() {
        for bad in [&["0"][..], &["-3"], &["x"], &["4-2"], &["1-8*1"], &[""]] {
            let e = format!("{:#}", p(bad).unwrap_err());
            assert!(e.contains("--batch-sizes"), "{bad:?}: {e}");
        }
    }
}

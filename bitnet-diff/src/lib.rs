//! `bitnet-diff`: statistically sound comparison of `bitnet-bench` reports for CI gating.
//! Not built yet: it needs the report format of `bitnet-bench`; see the tracker issue
//! "bitnet-diff: statistically sound regression gating".

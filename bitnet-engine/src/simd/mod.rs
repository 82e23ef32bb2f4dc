//! What the SIMD kernels of every operation share: the ISA tokens (`x86_avx2::Avx2`,
//! `x86_avx512::Avx512`: a value exists only where the CPU has the features, so the
//! `#[target_feature]` functions that take one are sound to call), their common register
//! helpers, the two macros that compile portable code for an ISA (`compiled_for!`) and call the
//! widest such build (`widest_compiled!`), and cache prefetch hints.

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_avx512;

use std::ops::Range;

/// Safe entry points `$name(token, args…)` that compile a portable Rust function (plain loops,
/// no intrinsics) with an ISA's target features enabled: the same IEEE operations in the same
/// order (Rust never fuses a multiply and an add on its own), so the same results as the
/// baseline build, with the compiler free to use wider vectors. The token proves the features.
#[cfg(target_arch = "x86_64")]
macro_rules! compiled_for {
    ($token:ty, $features:literal; $($name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $portable:path;)*) => {$(
        // The token adds an argument to the portable function's.
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name(_t: $token, $($arg: $ty),*) $(-> $ret)? {
            #[target_feature(enable = $features)]
            unsafe fn compiled($($arg: $ty),*) $(-> $ret)? {
                $portable($($arg),*)
            }
            // SAFETY: the token proves the CPU has these features; the body is safe Rust.
            unsafe { compiled($($arg),*) }
        }
    )*};
}

/// Calls `x86_avx512::$fast` where the CPU has AVX-512, else `x86_avx2::$fast` where it has
/// AVX2, else `$portable`, with the same arguments (the functions `compiled_for!` recompiles).
macro_rules! widest_compiled {
    ($fast:ident, $portable:path, $($arg:expr),*) => {{
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = $crate::simd::x86_avx512::Avx512::new() {
            return x86_avx512::$fast(t, $($arg),*);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = $crate::simd::x86_avx2::Avx2::new() {
            return x86_avx2::$fast(t, $($arg),*);
        }
        $portable($($arg),*)
    }};
}

/// Bytes at an address, kept only to ask for them in L2 ahead of their use: a prefetch never
/// faults, so a range may outlive what it names (a worker may still be asking for the first
/// rows of a step's next matmul when the step, or the model, is gone), and it is plain data
/// that any thread may hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchRange {
    pub(crate) start: usize,
    pub(crate) len: usize,
}

impl PrefetchRange {
    pub const EMPTY: Self = Self { start: 0, len: 0 };

    pub fn of<T>(data: &[T]) -> Self {
        Self { start: data.as_ptr() as usize, len: std::mem::size_of_val(data) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The part from byte `from` on, at most `max` bytes of it (empty past the end).
    pub fn window(self, from: usize, max: usize) -> Self {
        let from = from.min(self.len);
        Self { start: self.start + from, len: (self.len - from).min(max) }
    }

    /// Asks for the cache lines of bytes `bytes` of the range in L2 (nothing where there is
    /// no prefetch instruction).
    pub fn prefetch_l2(self, bytes: Range<usize>) {
        let (lo, hi) = (bytes.start.min(self.len), bytes.end.min(self.len));
        #[cfg(target_arch = "x86_64")]
        if lo < hi {
            // The address is only handed to a prefetch instruction, never dereferenced.
            x86_avx2::prefetch_l2((self.start + lo) as *const u8, hi - lo);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (lo, hi);
    }
}

/// Asks for `data`'s cache lines in L2 ahead of its use (nothing where there is no prefetch
/// instruction).
pub(crate) fn prefetch_l2<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    x86_avx2::prefetch_l2(data.as_ptr() as *const u8, std::mem::size_of_val(data));
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attention kernels' prefetch shares partition the lines of `ahead` in order, for any
    /// alignment, length and step count (more steps than lines too), and an empty `ahead` asks
    /// for nothing.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn prefetch_shares_cover_every_line_once_in_order() {
        let buf = vec![0u16; 4096];
        for offset in [0usize, 1, 31, 32, 33] {
            for len in [0usize, 1, 32, 33, 64, 96, 1000, 3000] {
                let ahead = &buf[offset..offset + len];
                let bytes = std::mem::size_of_val(ahead);
                let at = ahead.as_ptr() as usize;
                let lines = if len == 0 { 0 } else { (at + bytes - (at & !63)).div_ceil(64) };
                for steps in [1usize, 2, 3, 7, 16, 64, 129, 5000] {
                    let plan = x86_avx2::PrefetchShares::new(ahead, steps);
                    let mut next = 0;
                    for s in 0..steps {
                        let share = plan.share(s);
                        assert_eq!(share.start, next, "offset {offset} len {len} steps {steps} share {s}");
                        next = share.end.max(share.start);
                    }
                    assert_eq!(next, lines, "offset {offset} len {len} steps {steps}");
                }
            }
        }
    }
}

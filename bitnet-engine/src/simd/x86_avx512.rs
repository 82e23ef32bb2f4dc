//! The AVX-512 token and the 512-bit loads and stores every AVX-512 kernel uses.

use std::arch::x86_64::*;

use crate::cpu::IsaLevel;

/// Proof that AVX-512 F/BW/VL/VNNI/VPOPCNTDQ are available.
#[derive(Clone, Copy)]
pub(crate) struct Avx512(());

impl Avx512 {
    pub(crate) fn new() -> Option<Self> {
        IsaLevel::Avx512.is_supported().then_some(Avx512(()))
    }
}

#[inline(always)]
pub(crate) unsafe fn load(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

#[inline(always)]
pub(crate) unsafe fn store(p: *mut u8, v: __m512i) {
    _mm512_storeu_si512(p as *mut _, v)
}

/// Sum of all i32 lanes of a token's accumulators.
#[inline(always)]
pub(crate) unsafe fn reduce_acc<const A: usize>(acc: &[__m512i; A]) -> i32 {
    let mut s = acc[0];
    for a in &acc[1..] {
        s = _mm512_add_epi32(s, *a);
    }
    _mm512_reduce_add_epi32(s)
}

//! Cache-line aligned byte and word buffers for packed weights and activations.
//!
//! `Vec<u8>` only guarantees 1-byte alignment; SIMD loads of packed blocks that straddle cache
//! lines cost extra on every x86 core, and a streaming kernel reads nothing else.

/// One 64-byte cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

const _: () = assert!(std::mem::size_of::<Line>() == 64 && std::mem::align_of::<Line>() == 64);

/// A zero-initialised, 64-byte aligned byte buffer of fixed length.
#[derive(Clone)]
pub struct AlignedBytes {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBytes {
    pub fn zeroed(len: usize) -> Self {
        Self { lines: vec![Line([0; 64]); len.div_ceil(64)], len }
    }

    pub fn filled(len: usize, value: u8) -> Self {
        Self { lines: vec![Line([value; 64]); len.div_ceil(64)], len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `lines` is a contiguous allocation of `lines.len() * 64` initialised bytes
        // (Line is repr(C) over [u8; 64], no padding), and `len <= lines.len() * 64`.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const u8, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut u8, self.len) }
    }

    /// The bytes reinterpreted as `i8` (same size and alignment).
    pub fn as_i8(&self) -> &[i8] {
        // SAFETY: u8 and i8 have identical size and alignment and every bit pattern is valid.
        unsafe { std::slice::from_raw_parts(self.as_slice().as_ptr() as *const i8, self.len) }
    }

    pub fn as_i8_mut(&mut self) -> &mut [i8] {
        let s = self.as_mut_slice();
        // SAFETY: as in `as_i8`; exclusive borrow carried over.
        unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut i8, s.len()) }
    }
}

impl std::fmt::Debug for AlignedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBytes({} bytes)", self.len)
    }
}

impl PartialEq for AlignedBytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_sized() {
        for len in [0, 1, 63, 64, 65, 1000] {
            let mut b = AlignedBytes::filled(len, 7);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            assert!(b.as_slice().iter().all(|v| *v == 7));
            if len > 0 {
                b.as_mut_slice()[len - 1] = 255;
                assert_eq!(b.as_i8()[len - 1], -1);
            }
        }
    }
}

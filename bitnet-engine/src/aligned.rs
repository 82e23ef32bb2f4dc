//! Cache-line aligned buffers for packed weights and activations, in huge pages when large.
//!
//! `Vec<u8>` only guarantees 1-byte alignment; SIMD loads of packed blocks that straddle cache
//! lines cost extra on every x86 core, and a streaming kernel reads nothing else.
//!
//! Buffers of [`SHARED_MIN`] bytes or more live in anonymous mappings aligned to 2 MiB and
//! advised `MADV_HUGEPAGE`, so that where transparent huge pages are enabled (`always` or
//! `madvise`) the kernel backs them with 2 MiB pages. Weights are streamed once per token: with
//! 4 KiB pages the stream needs a new address translation (a TLB miss and page walk) every
//! 4 KiB, with huge pages every 2 MiB, and one thread streams measurably faster from huge pages
//! (docs/perf-notes.md). The bandwidth probe uses the same buffers, so the roofline is measured
//! on the memory the weights live in. Where huge pages are
//! unavailable the advice is ignored and the buffers are ordinary pages.
//!
//! Buffers below [`HUGE_PAGE_MIN`] are carved one after another from 64 MiB regions, one
//! current region per thread: a layer's seven matrices then lie back to back in the order they
//! were made, which is the order decode reads them, and the kernels see one long stream per
//! layer instead of seven short ones (a 0.4 MB K projection that started a new stream had read
//! slower than its neighbours; now all are alike). Larger buffers (embeddings,
//! LM head, the probe) get a mapping each.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};

use memmap2::{Advice, MmapMut};

/// One 64-byte cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

const _: () = assert!(std::mem::size_of::<Line>() == 64 && std::mem::align_of::<Line>() == 64);

/// Size of a transparent huge page on x86-64.
const HUGE_PAGE: usize = 2 << 20;

/// Buffers from this size on get a huge-page mapping of their own (embeddings, LM heads, the
/// bandwidth probe). Each such mapping is rounded up to whole 2 MiB pages, which for every
/// matrix of a layer cost 180 MB of RSS on 2B4T before the matrices shared regions.
pub const HUGE_PAGE_MIN: usize = 16 << 20;

/// Buffers from this size up to [`HUGE_PAGE_MIN`] are carved from shared huge-page regions.
/// From 4 KiB pages, the 0.4 MB 2B4T K and V projections streamed at about half the speed of
/// their neighbours (docs/perf-notes.md). Smaller buffers stay on the heap.
pub const SHARED_MIN: usize = 64 << 10;

/// Size of one shared region (32 huge pages; a 2B4T layer is 17.4 MB). Only its touched huge
/// pages take memory, so a region's unused tail costs address space, not RSS.
const REGION_BYTES: usize = 32 * HUGE_PAGE;

/// Zero-initialised, 64-byte aligned memory: heap lines, a mapping for huge pages, or a range
/// of a shared huge-page region.
enum Storage {
    Heap(Vec<Line>),
    /// `bytes` usable bytes from `offset`, the first 2 MiB boundary in `map`.
    Mapped {
        map: MmapMut,
        offset: usize,
    },
    /// Bytes `offset..` of `region`, a range no other buffer is given.
    Shared {
        region: Arc<Region>,
        offset: usize,
    },
}

/// A 2 MiB-aligned, huge-page advised mapping from which [`Storage::Shared`] buffers are carved,
/// each a disjoint range, never reused: the region is unmapped when its last buffer drops.
struct Region {
    /// Keeps the mapping alive; only reached through `base`.
    _map: MmapMut,
    /// First 2 MiB boundary of the mapping; `REGION_BYTES` usable bytes from here.
    base: *mut u8,
}

// SAFETY: `base` points into `_map`, which lives as long as the Region; every buffer that
// reads or writes through it owns a distinct range (handed out once, by the one thread that
// carves from it), so no two threads ever touch the same bytes through a shared Region.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

thread_local! {
    /// The region this thread carves new shared buffers from, and its first unused byte. Per
    /// thread, so that what one thread allocates in order (a layer's matrices, when weights are
    /// generated or loaded on several threads) lies in order in memory, one stream for the
    /// kernels. Weak, so that a region whose buffers were all dropped is unmapped even while it
    /// is the current one.
    static CURRENT: RefCell<Option<(Weak<Region>, usize)>> = const { RefCell::new(None) };
}

/// An anonymous mapping with `bytes` (a multiple of 2 MiB) usable from `offset`, its first 2 MiB
/// boundary, advised for huge pages. The map is one huge page longer than `bytes`; the pages
/// before the boundary are never touched, so they cost address space only. The advice may be
/// refused (no transparent huge pages), and the mapping then works with ordinary pages.
fn huge_page_map(bytes: usize) -> Option<(MmapMut, usize)> {
    debug_assert!(bytes.is_multiple_of(HUGE_PAGE));
    let map = MmapMut::map_anon(bytes + HUGE_PAGE).ok()?;
    let offset = (HUGE_PAGE - map.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
    let _ = map.advise_range(Advice::HugePage, offset, bytes);
    Some((map, offset))
}

impl Region {
    fn new() -> Option<Arc<Region>> {
        let (mut map, offset) = huge_page_map(REGION_BYTES)?;
        let base = map[offset..].as_mut_ptr();
        Some(Arc::new(Region { _map: map, base }))
    }

    /// `bytes` (≤ `REGION_BYTES`) fresh, zeroed bytes at a 64-byte aligned offset.
    fn carve(bytes: usize) -> Option<(Arc<Region>, usize)> {
        let bytes = bytes.div_ceil(64) * 64;
        CURRENT.with_borrow_mut(|current| {
            if let Some((weak, next)) = current.as_mut() {
                if let Some(region) = weak.upgrade() {
                    if *next + bytes <= REGION_BYTES {
                        let offset = *next;
                        *next += bytes;
                        return Some((region, offset));
                    }
                }
            }
            let region = Region::new()?;
            *current = Some((Arc::downgrade(&region), bytes));
            Some((region, 0))
        })
    }
}

/// Whether large buffers are mapped for huge pages: yes unless the environment variable
/// `BITNET_HUGE_PAGES` is `0` (to measure what they bring, or to match an engine without them).
pub fn huge_pages_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("BITNET_HUGE_PAGES").is_none_or(|v| v != "0"))
}

impl Storage {
    fn zeroed(bytes: usize) -> Self {
        if bytes >= HUGE_PAGE_MIN && huge_pages_enabled() {
            // Whole huge pages: the kernel only backs fully advised, aligned 2 MiB ranges with
            // huge pages, so advising just `bytes` would leave each buffer's last partial 2 MiB
            // on 4 KiB pages. The rounding costs under 2 MiB of memory per buffer.
            if let Some((map, offset)) = huge_page_map(bytes.div_ceil(HUGE_PAGE) * HUGE_PAGE) {
                return Storage::Mapped { map, offset };
            }
        }
        if bytes >= SHARED_MIN && huge_pages_enabled() {
            if let Some((region, offset)) = Region::carve(bytes) {
                return Storage::Shared { region, offset };
            }
        }
        Storage::Heap(vec![Line([0; 64]); bytes.div_ceil(64)])
    }

    fn ptr(&self) -> *const u8 {
        match self {
            Storage::Heap(v) => v.as_ptr() as *const u8,
            Storage::Mapped { map, offset } => map[*offset..].as_ptr(),
            // SAFETY: offset + len ≤ REGION_BYTES (checked when carved), inside the mapping.
            Storage::Shared { region, offset } => unsafe { region.base.add(*offset) },
        }
    }

    fn mut_ptr(&mut self) -> *mut u8 {
        match self {
            Storage::Heap(v) => v.as_mut_ptr() as *mut u8,
            Storage::Mapped { map, offset } => map[*offset..].as_mut_ptr(),
            // SAFETY: as in `ptr`; this buffer's range is its own (see `Region`).
            Storage::Shared { region, offset } => unsafe { region.base.add(*offset) },
        }
    }
}

/// Element types a [`PageVec`] may hold: plain data for which every bit pattern, including
/// all zeros, is a valid value, with an alignment of at most 64.
///
/// # Safety
/// Implementors must have no padding-dependent invariants, no pointers and no niches.
pub unsafe trait Pod: Copy + 'static {}

// SAFETY: integers and floats are valid for every bit pattern.
unsafe impl Pod for u8 {}
unsafe impl Pod for i8 {}
unsafe impl Pod for u64 {}
unsafe impl Pod for f32 {}
// SAFETY: a transparent u16; all-zero bits are +0.0.
unsafe impl Pod for half::f16 {}

/// A fixed-length, 64-byte aligned array of `T`, zero-initialised, in huge pages when large.
pub struct PageVec<T: Pod> {
    storage: Storage,
    len: usize,
    _t: PhantomData<T>,
}

// SAFETY: a PageVec owns its memory exclusively (like Vec<T>); T: Pod has no interior
// references, so sending or sharing it across threads is as safe as for Vec<T>.
unsafe impl<T: Pod + Send> Send for PageVec<T> {}
unsafe impl<T: Pod + Sync> Sync for PageVec<T> {}

impl<T: Pod> PageVec<T> {
    const CHECK: () = assert!(std::mem::align_of::<T>() <= 64);

    /// `len` elements, all bits zero.
    pub fn zeroed(len: usize) -> Self {
        #[allow(clippy::let_unit_value)]
        let _ = Self::CHECK;
        let bytes = len.checked_mul(std::mem::size_of::<T>()).expect("buffer size overflows usize");
        Self { storage: Storage::zeroed(bytes), len, _t: PhantomData }
    }

    /// `len` copies of `value`.
    pub fn filled(len: usize, value: T) -> Self {
        let mut v = Self::zeroed(len);
        v.fill(value);
        v
    }

    /// A copy of `items`.
    pub fn from_slice(items: &[T]) -> Self {
        let mut v = Self::zeroed(items.len());
        v.copy_from_slice(items);
        v
    }

    /// The values whose in-memory bytes are `bytes` (a whole number of `T`s; `None`
    /// otherwise), copied straight into the buffer: for file data already laid out as `T`s in
    /// this host's byte order, without building a `Vec<T>` first (which a large tensor pays
    /// for twice: its pages, then the copy).
    pub fn from_raw_bytes(bytes: &[u8]) -> Option<Self> {
        let size = std::mem::size_of::<T>();
        if size == 0 || !bytes.len().is_multiple_of(size) {
            return None;
        }
        let mut v = Self::zeroed(bytes.len() / size);
        // SAFETY: the storage holds len × size = bytes.len() bytes, a new allocation that
        // cannot overlap `bytes`, and every bit pattern is a valid T (`Pod`).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.storage.mut_ptr(), bytes.len()) };
        Some(v)
    }

    /// Whether the buffer lives in memory advised for huge pages, its own mapping or a shared
    /// region (whether the kernel granted huge pages is its business: see `AnonHugePages` in
    /// /proc/meminfo).
    pub fn is_mapped(&self) -> bool {
        !matches!(self.storage, Storage::Heap(_))
    }
}

impl<T: Pod> std::ops::Deref for PageVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the storage holds at least `len * size_of::<T>()` initialised (zeroed or
        // written) bytes at a 64-byte aligned address, which satisfies T's alignment
        // (checked ≤ 64), and every bit pattern is a valid T (Pod).
        unsafe { std::slice::from_raw_parts(self.storage.ptr() as *const T, self.len) }
    }
}

impl<T: Pod> std::ops::DerefMut for PageVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.storage.mut_ptr() as *mut T, self.len) }
    }
}

impl<T: Pod> Clone for PageVec<T> {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl<T: Pod + PartialEq> PartialEq for PageVec<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Pod + std::fmt::Debug> std::fmt::Debug for PageVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PageVec({} × {})", self.len, std::any::type_name::<T>())
    }
}

/// A zero-initialised, 64-byte aligned byte buffer of fixed length.
#[derive(Clone, PartialEq)]
pub struct AlignedBytes {
    bytes: PageVec<u8>,
}

impl AlignedBytes {
    pub fn zeroed(len: usize) -> Self {
        Self { bytes: PageVec::zeroed(len) }
    }

    pub fn filled(len: usize, value: u8) -> Self {
        Self { bytes: PageVec::filled(len, value) }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    /// The bytes reinterpreted as `i8` (same size and alignment).
    pub fn as_i8(&self) -> &[i8] {
        // SAFETY: u8 and i8 have identical size and alignment and every bit pattern is valid.
        unsafe { std::slice::from_raw_parts(self.as_slice().as_ptr() as *const i8, self.len()) }
    }

    pub fn as_i8_mut(&mut self) -> &mut [i8] {
        let s = self.as_mut_slice();
        // SAFETY: as in `as_i8`; exclusive borrow carried over.
        unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut i8, s.len()) }
    }
}

impl std::fmt::Debug for AlignedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBytes({} bytes)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_sized() {
        for len in [0, 1, 63, 64, 65, 1000, SHARED_MIN, SHARED_MIN + 65, HUGE_PAGE_MIN, HUGE_PAGE_MIN + 4097] {
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

    #[test]
    fn raw_bytes_become_values_in_host_order() {
        let values: Vec<u64> = (0..HUGE_PAGE_MIN as u64 / 8 + 5).map(|i| i * 0x0101_0101 + 7).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let v = PageVec::<u64>::from_raw_bytes(&bytes).unwrap();
        assert!(v.is_mapped());
        assert_eq!(&v[..], &values[..]);
        assert!(PageVec::<u64>::from_raw_bytes(&bytes[..bytes.len() - 1]).is_none());
        assert!(PageVec::<u64>::from_raw_bytes(&[]).unwrap().is_empty());
    }

    #[test]
    fn large_buffers_are_mapped_aligned_zeroed_and_copied() {
        let mut v: PageVec<u64> = PageVec::zeroed(HUGE_PAGE_MIN / 8 + 3);
        assert!(v.is_mapped());
        assert_eq!(v.as_ptr() as usize % HUGE_PAGE, 0, "starts on a huge-page boundary");
        assert!(v.iter().all(|x| *x == 0));
        let n = v.len();
        v[n - 1] = 42;
        v[0] = 7;
        let c = v.clone();
        assert!(c.is_mapped() && c == v && c[n - 1] == 42 && c[0] == 7);
        assert!(!PageVec::<u8>::zeroed(100).is_mapped());
        let f = PageVec::from_slice(&[1u8, 2, 3]);
        assert_eq!(&f[..], &[1, 2, 3]);
    }

    #[test]
    fn mid_size_buffers_are_disjoint_zeroed_ranges_of_shared_regions() {
        // Only what holds whatever else this thread allocated before is asserted: each buffer
        // is in advised memory, aligned, zeroed, and writes to one never show in another.
        let sizes = [SHARED_MIN, SHARED_MIN + 1, 3 * SHARED_MIN + 100, HUGE_PAGE_MIN - 64];
        let mut bufs: Vec<PageVec<u8>> = sizes.iter().map(|&n| PageVec::zeroed(n)).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            assert!(b.is_mapped(), "{} bytes should be in a shared region", b.len());
            assert_eq!(b.as_ptr() as usize % 64, 0);
            assert!(b.iter().all(|x| *x == 0), "fresh range is zeroed");
            b.fill(i as u8 + 1);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.iter().all(|x| *x == i as u8 + 1), "buffer {i} was overwritten by another");
        }
        let mut ranges: Vec<(usize, usize)> = bufs.iter().map(|b| (b.as_ptr() as usize, b.len())).collect();
        ranges.sort();
        for w in ranges.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "ranges overlap: {w:?}");
        }
        assert!(!PageVec::<u8>::zeroed(SHARED_MIN - 1).is_mapped(), "small buffers stay on the heap");
    }
}

//! GGUF parsing from a byte slice (usually a memory map), with every read bounds-checked.
//!
//! Layout (GGUF v2/v3): magic `GGUF`, version u32, tensor count u64, metadata count u64; the
//! metadata key/value pairs; the tensor infos (name, n_dims u32, dims u64 × n_dims — fastest
//! first —, type u32, offset u64); then, aligned to `general.alignment` (default 32), the data
//! section that the offsets point into. A malformed file gives an error naming the key or
//! tensor and what was wrong; nothing here panics or reads out of bounds.

use std::fmt;

use crate::error::{Error, Result};
use crate::gguf::types::GgmlType;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(v) => write!(f, "[{} × {}]", v.len(), v.first().map_or("?", |x| x.type_name())),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            other => write!(f, "{}", other.as_u64().map_or_else(|| format!("{other:?}"), |v| v.to_string())),
        }
    }
}

/// One tensor's description.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDesc {
    pub name: String,
    /// GGUF dims, fastest-varying first: a `[rows, cols]` matrix has `dims = [cols, rows]`.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset of the data from the start of the data section.
    pub offset: u64,
    /// Exact bytes of the data.
    pub size: usize,
}

impl TensorDesc {
    /// Elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// `(rows, cols)` of a 1- or 2-D tensor (rows = 1 for vectors).
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = self.dims.first().copied().unwrap_or(1) as usize;
        let rows = self.dims.iter().skip(1).product::<u64>() as usize;
        (rows, cols)
    }
}

/// A parsed GGUF file borrowing its bytes.
#[derive(Debug)]
pub struct GgufFile<'a> {
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorDesc>,
    pub alignment: usize,
    /// Absolute offset of the data section.
    pub data_offset: usize,
    bytes: &'a [u8],
}

const MAX_DIMS: u32 = 4;
const MAX_ARRAY_DEPTH: usize = 2;

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.b.len() - self.pos {
            return Err(Error::Format(format!(
                "{}: needs {n} bytes at offset {}, but the file ends at {}",
                what(),
                self.pos,
                self.b.len()
            )));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &dyn Fn() -> String) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }
    fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let n = self.u64(what)?;
        if n > self.remaining() as u64 {
            return Err(Error::Format(format!(
                "{}: string length {n} exceeds the {} bytes left",
                what(),
                self.remaining()
            )));
        }
        let s = self.take(n as usize, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| Error::Format(format!("{}: string is not valid UTF-8", what())))
    }

    fn value(&mut self, ty: u32, depth: usize, what: &dyn Fn() -> String) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.u8(what)?),
            1 => Value::I8(self.u8(what)? as i8),
            2 => Value::U16(self.u16(what)?),
            3 => Value::I16(self.u16(what)? as i16),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(self.u32(what)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(what)?)),
            7 => match self.u8(what)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(Error::Format(format!("{}: bool byte is {b}, expected 0 or 1", what()))),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(Error::Format(format!("{}: arrays nested deeper than {MAX_ARRAY_DEPTH}", what())));
                }
                let et = self.u32(what)?;
                let n = self.u64(what)?;
                // Every element takes at least one byte (strings at least 8): refuse counts the
                // rest of the file cannot hold before allocating for them.
                let min = match et {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    _ => return Err(Error::Format(format!("{}: unknown array element type {et}", what()))),
                };
                if n.saturating_mul(min) > self.remaining() as u64 {
                    return Err(Error::Format(format!(
                        "{}: array of {n} elements cannot fit in the {} bytes left",
                        what(),
                        self.remaining()
                    )));
                }
                let mut v = Vec::with_capacity(n as usize);
                for i in 0..n {
                    v.push(self.value(et, depth + 1, &|| format!("{}[{i}]", what()))?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(self.u64(what)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(what)?)),
            _ => return Err(Error::Format(format!("{}: unknown value type {ty}", what()))),
        })
    }
}

/// Weights bitnet.cpp's `llama-quantize` hands to one quantize call per thread: 16384 rounded up
/// to whole rows (`min_chunk_size` in its `llama_tensor_quantize_internal`).
const QUANTIZE_CHUNK_WEIGHTS: u64 = 16384;

/// Refuses I2_S tensors that bitnet.cpp's `llama-quantize` damaged by quantizing with more than
/// one thread: each chunk of rows is written at four times its packed offset with its own scale
/// after it, so the tensor takes `n/4 + 32 × chunks` bytes in the file instead of `n/4 + 32` and
/// most rows are missing. The file's tensor offsets show it: the span up to the next tensor (or
/// the end of the data) is that damaged size, padded to the alignment.
fn check_i2s_spans(tensors: &[TensorDesc], alignment: usize, data_len: u64) -> Result<()> {
    let mut order: Vec<&TensorDesc> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for (i, t) in order.iter().enumerate() {
        if t.ggml_type != GgmlType::I2S {
            continue;
        }
        let end = order.get(i + 1).map_or(data_len, |n| n.offset);
        let span = end.saturating_sub(t.offset);
        let (rows, cols) = (t.elements() / t.dims[0], t.dims[0]);
        let rows_per_chunk = QUANTIZE_CHUNK_WEIGHTS.div_ceil(cols);
        let chunks = rows.div_ceil(rows_per_chunk);
        if chunks < 2 {
            continue;
        }
        let damaged = t.elements() / 4 + 32 * chunks;
        let healthy_span = (t.size as u64).div_ceil(alignment as u64) * alignment as u64;
        if span != healthy_span && span >= damaged && span < damaged + alignment as u64 {
            return Err(Error::Format(format!(
                "tensor '{}' is damaged: its I2_S data takes {damaged} bytes in the file where {} are expected \
                 (rows × cols / 4 + 32). That is what bitnet.cpp's llama-quantize writes when it quantizes I2_S \
                 with more than one thread: each of its {chunks} chunks of {rows_per_chunk} rows went to four times \
                 its offset with its own scale, so most rows are missing. Requantize from the F32/F16 GGUF with one \
                 thread: llama-quantize IN.gguf OUT.gguf I2_S 1",
                t.name, t.size
            )));
        }
    }
    Ok(())
}

impl<'a> GgufFile<'a> {
    /// Parses the header, metadata and tensor infos of `bytes` and checks that every tensor's
    /// data lies inside it.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        let mut c = Cursor { b: bytes, pos: 0 };
        let magic = c.take(4, &|| "header magic".into())?;
        if magic != b"GGUF" {
            return Err(Error::Format(format!("not a GGUF file: magic is {magic:?}, expected \"GGUF\"")));
        }
        let version = c.u32(&|| "header version".into())?;
        if !(2..=3).contains(&version) {
            return Err(Error::Format(format!("GGUF version {version} is not supported (2 and 3 are)")));
        }
        let n_tensors = c.u64(&|| "header tensor count".into())?;
        let n_kv = c.u64(&|| "header metadata count".into())?;
        // A key/value pair takes ≥ 12 bytes, a tensor info ≥ 24: refuse impossible counts early.
        if n_kv.saturating_mul(12) > c.remaining() as u64 || n_tensors.saturating_mul(24) > c.remaining() as u64 {
            return Err(Error::Format(format!(
                "header claims {n_kv} metadata entries and {n_tensors} tensors, more than the file's {} bytes can hold",
                bytes.len()
            )));
        }
        let mut metadata = Vec::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let key = c.string(&|| format!("metadata entry {i}: key"))?;
            let what = || format!("metadata key '{key}'");
            let ty = c.u32(&what)?;
            let v = c.value(ty, 0, &what)?;
            metadata.push((key, v));
        }
        // llama.cpp's and gguf-py's readers refuse duplicates: which copy counts would be a guess.
        let mut seen = std::collections::HashSet::with_capacity(metadata.len());
        if let Some((k, _)) = metadata.iter().find(|(k, _)| !seen.insert(k.as_str())) {
            return Err(Error::Format(format!("metadata key '{k}' appears more than once; the file is damaged")));
        }
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => 32,
            Some((_, v)) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
                _ => {
                    return Err(Error::Format(format!(
                        "metadata key 'general.alignment' is {v}; expected a power of two"
                    )))
                }
            },
        };
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = c.string(&|| format!("tensor info {i}: name"))?;
            let what = || format!("tensor '{name}'");
            let n_dims = c.u32(&what)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(Error::Format(format!("{}: has {n_dims} dimensions, expected 1 to {MAX_DIMS}", what())));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = c.u64(&what)?;
                if d == 0 {
                    return Err(Error::Format(format!("{}: has a zero dimension", what())));
                }
                dims.push(d);
            }
            let ty = c.u32(&what)?;
            let ggml_type = GgmlType::from_id(ty).ok_or_else(|| {
                Error::Format(format!("{}: tensor type id {ty} is not one this engine knows", what()))
            })?;
            let offset = c.u64(&what)?;
            let elements = dims.iter().try_fold(1u64, |a, d| a.checked_mul(*d)).filter(|e| *e <= 1 << 40);
            let Some(elements) = elements else {
                return Err(Error::Format(format!("{}: dimensions {dims:?} are too large", what())));
            };
            let size = ggml_type.byte_size(dims[0], elements).map_err(|e| Error::Format(format!("{}: {e}", what())))?;
            tensors.push(TensorDesc { name, dims, ggml_type, offset, size });
        }
        let mut seen = std::collections::HashSet::with_capacity(tensors.len());
        if let Some(t) = tensors.iter().find(|t| !seen.insert(t.name.as_str())) {
            return Err(Error::Format(format!(
                "tensor '{}' appears more than once in the tensor infos; the file is damaged (llama.cpp refuses it too)",
                t.name
            )));
        }
        let data_offset = c.pos.div_ceil(alignment) * alignment;
        check_i2s_spans(&tensors, alignment, bytes.len().saturating_sub(data_offset) as u64)?;
        for t in &tensors {
            if t.offset % alignment as u64 != 0 {
                return Err(Error::Format(format!(
                    "tensor '{}': data offset {} is not a multiple of the alignment {alignment}",
                    t.name, t.offset
                )));
            }
            let end = (data_offset as u64).checked_add(t.offset).and_then(|s| s.checked_add(t.size as u64));
            if end.is_none_or(|e| e > bytes.len() as u64) {
                return Err(Error::Format(format!(
                    "tensor '{}': {} bytes of {} data at offset {} run past the end of the file ({} bytes); the file may be truncated",
                    t.name,
                    t.size,
                    t.ggml_type.name(),
                    data_offset as u64 + t.offset,
                    bytes.len()
                )));
            }
        }
        Ok(Self { version, metadata, tensors, alignment, data_offset, bytes })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorDesc> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of a tensor's data (bounds were checked by `parse`).
    pub fn data(&self, t: &TensorDesc) -> &'a [u8] {
        let start = self.data_offset + t.offset as usize;
        &self.bytes[start..start + t.size]
    }
}

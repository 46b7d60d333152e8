//! GGUF reader: header, metadata, tensor infos and tensor bytes, over a memory map.
//!
//! Owns the file format and nothing else. Every length, count and offset read from the
//! file is checked against the bytes that are really there and against the caps below
//! before anything is allocated, so a truncated, oversized or hostile file yields a
//! [`GgufError`] that says what is wrong, never a panic or an absurd allocation.
//!
//! Format reference: the GGUF spec in ggml's docs (`docs/gguf.md`).

mod mmap;
mod types;
mod writer;

pub use mmap::MappedFile;
pub use types::GgmlType;
pub use writer::GgufWriter;

use crate::error::GgufError;
use std::collections::HashMap;
use std::path::Path;

/// Caps on what a file may declare; generous for real models, fatal for nonsense.
pub const MAX_TENSORS: u64 = 1 << 20;
pub const MAX_KV: u64 = 1 << 20;
pub const MAX_STRING: u64 = 1 << 26;
pub const MAX_ARRAY: u64 = 1 << 26;
pub const MAX_DIMS: u32 = 4;
pub const MAX_ARRAY_DEPTH: u32 = 4;
const DEFAULT_ALIGNMENT: u64 = 32;

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
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// The value as a float, if it is numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
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
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's description; `offset` is absolute in the file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions as GGUF lists them: `dims[0]` is the contiguous (row) length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub offset: u64,
    pub size: u64,
}

impl TensorInfo {
    pub fn num_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file. Tensor bytes stay in the map until asked for.
pub struct Gguf {
    file: MappedFile,
    pub version: u32,
    pub alignment: u64,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl Gguf {
    /// Maps and parses the file at `path`: a regular file, or a symlink to one. A
    /// directory, FIFO, device or socket is [`GgufError::NotAFile`], found before the
    /// path is opened (so a FIFO never blocks).
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        Self::parse(MappedFile::open(path)?)
    }

    fn parse(file: MappedFile) -> Result<Self, GgufError> {
        let (version, alignment, metadata, tensors) = {
            let mut r = Reader {
                buf: file.bytes(),
                pos: 0,
            };
            let magic: [u8; 4] = r.take(&"magic", 4)?.try_into().expect("4 bytes");
            if &magic != b"GGUF" {
                return Err(GgufError::BadMagic(magic));
            }
            let version = r.u32(&"version")?;
            if version != 2 && version != 3 {
                return Err(GgufError::UnsupportedVersion(version));
            }
            let n_tensors = r.u64(&"tensor count")?;
            let n_kv = r.u64(&"metadata count")?;
            cap(|| "tensor count".into(), n_tensors, MAX_TENSORS)?;
            cap(|| "metadata count".into(), n_kv, MAX_KV)?;
            let mut metadata = Vec::new();
            for _ in 0..n_kv {
                let key = r.string(&"metadata key")?;
                let ty = r.u32(&"metadata value type")?;
                let value = r.value(&key, ty, 0)?;
                metadata.push((key, value));
            }
            let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
                Some((_, v)) => {
                    let a = v.as_u64().unwrap_or(0);
                    if a == 0 || !a.is_power_of_two() || a > 1 << 20 {
                        return Err(GgufError::BadAlignment(a));
                    }
                    a
                }
                None => DEFAULT_ALIGNMENT,
            };
            let mut infos = Vec::new();
            for _ in 0..n_tensors {
                let name = r.string(&"tensor name")?;
                let n_dims = r.u32(&"tensor dimension count")?;
                if n_dims == 0 || n_dims > MAX_DIMS {
                    return Err(GgufError::BadTensor {
                        name,
                        reason: format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
                    });
                }
                let mut dims = Vec::with_capacity(n_dims as usize);
                for _ in 0..n_dims {
                    dims.push(r.u64(&"tensor dimension")?);
                }
                let ty_id = r.u32(&"tensor type")?;
                let rel = r.u64(&"tensor offset")?;
                let ty = GgmlType::from_id(ty_id).ok_or(GgufError::UnknownTensorType {
                    name: name.clone(),
                    ty: ty_id,
                })?;
                infos.push((name, dims, ty, rel));
            }
            let data_start = r.pos.next_multiple_of(alignment as usize) as u64;
            let len = file.bytes().len() as u64;
            let mut tensors = Vec::with_capacity(infos.len());
            for (name, dims, ty, rel) in infos {
                let bad = |reason: String| GgufError::BadTensor {
                    name: name.clone(),
                    reason,
                };
                let mut n: u64 = 1;
                for &d in &dims {
                    n = n
                        .checked_mul(d)
                        .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
                }
                let row = dims[0];
                let size = ty
                    .row_bytes(row)
                    .and_then(|rb| rb.checked_mul(n / row.max(1)))
                    .ok_or_else(|| {
                        bad(format!(
                            "row length {row} is not a whole number of {ty} blocks"
                        ))
                    })?;
                if rel % alignment != 0 {
                    return Err(bad(format!(
                        "offset {rel} is not aligned to {alignment} bytes"
                    )));
                }
                let offset = data_start
                    .checked_add(rel)
                    .ok_or_else(|| bad(format!("offset {rel} overflows")))?;
                let end = offset
                    .checked_add(size)
                    .ok_or_else(|| bad(format!("size {size} overflows")))?;
                if end > len {
                    return Err(GgufError::Truncated {
                        what: format!("tensor {name:?}"),
                        start: offset,
                        end,
                        len,
                    });
                }
                tensors.push(TensorInfo {
                    name,
                    dims,
                    ty,
                    offset,
                    size,
                });
            }
            (version, alignment, metadata, tensors)
        };
        let mut meta_index = HashMap::new();
        for (i, (k, _)) in metadata.iter().enumerate() {
            if meta_index.insert(k.clone(), i).is_some() {
                return Err(GgufError::Duplicate {
                    what: "metadata key",
                    name: k.clone(),
                });
            }
        }
        let mut tensor_index = HashMap::new();
        for (i, t) in tensors.iter().enumerate() {
            if tensor_index.insert(t.name.clone(), i).is_some() {
                return Err(GgufError::Duplicate {
                    what: "tensor",
                    name: t.name.clone(),
                });
            }
        }
        Ok(Self {
            file,
            version,
            alignment,
            metadata,
            meta_index,
            tensors,
            tensor_index,
        })
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.file.bytes()
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }
    /// The metadata value under `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }
    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }
    /// The bytes of a tensor (already bounds-checked at parse time).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        &self.file.bytes()[t.offset as usize..(t.offset + t.size) as usize]
    }

    /// Drops bytes `range` of the file from this process's resident memory (see
    /// [`MappedFile::release`]): what has been copied out need not be held twice.
    pub fn release(&self, range: std::ops::Range<usize>) {
        self.file.release(range);
    }

    /// [`Gguf::release`] of a tensor's bytes.
    pub fn release_tensor(&self, t: &TensorInfo) {
        self.release(t.offset as usize..(t.offset + t.size) as usize);
    }

    /// The 128-bit xxh3 of the whole file (the model's identity), read a piece at a
    /// time and each piece released after it is read, so hashing leaves the file no
    /// more resident than it found it.
    pub fn fingerprint(&self) -> [u8; 16] {
        const PIECE: usize = 8 << 20;
        let bytes = self.file.bytes();
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for (i, piece) in bytes.chunks(PIECE).enumerate() {
            h.update(piece);
            self.release(i * PIECE..i * PIECE + piece.len());
        }
        h.digest128().to_le_bytes()
    }
}

/// `what` names the value in the error only: it is built only when the cap is passed.
fn cap(what: impl FnOnce() -> String, value: u64, limit: u64) -> Result<(), GgufError> {
    if value > limit {
        return Err(GgufError::TooLarge {
            what: what(),
            value,
            limit,
        });
    }
    Ok(())
}

/// What a read is called in its error message. A fixed name is a `&str`; a name that
/// needs formatting is a closure, so it is built only when an error is raised (a
/// vocabulary's hundreds of thousands of strings are read without a `format!` each).
trait Label {
    fn text(&self) -> String;
}

impl Label for &str {
    fn text(&self) -> String {
        (*self).to_string()
    }
}

impl<F: Fn() -> String> Label for F {
    fn text(&self) -> String {
        self()
    }
}

/// A bounds-checked little-endian cursor.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, what: &dyn Label, n: u64) -> Result<&'a [u8], GgufError> {
        let len = self.buf.len() as u64;
        let start = self.pos as u64;
        let end = start.saturating_add(n);
        if end > len {
            return Err(GgufError::Truncated {
                what: what.text(),
                start,
                end,
                len,
            });
        }
        let s = &self.buf[self.pos..end as usize];
        self.pos = end as usize;
        Ok(s)
    }
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }
    fn arr<const N: usize>(&mut self, what: &dyn Label) -> Result<[u8; N], GgufError> {
        Ok(self.take(what, N as u64)?.try_into().expect("N bytes"))
    }
    fn u32(&mut self, what: &dyn Label) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    fn u64(&mut self, what: &dyn Label) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    fn string(&mut self, what: &dyn Label) -> Result<String, GgufError> {
        let n = u64::from_le_bytes(self.arr(what)?);
        cap(|| format!("length of {}", what.text()), n, MAX_STRING)?;
        let bytes = self.take(what, n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadUtf8(what.text()))
    }
    fn value(&mut self, key: &str, ty: u32, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.arr::<1>(&key)?[0]),
            1 => Value::I8(self.arr::<1>(&key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr(&key)?)),
            3 => Value::I16(i16::from_le_bytes(self.arr(&key)?)),
            4 => Value::U32(self.u32(&key)?),
            5 => Value::I32(i32::from_le_bytes(self.arr(&key)?)),
            6 => Value::F32(f32::from_le_bytes(self.arr(&key)?)),
            7 => Value::Bool(self.arr::<1>(&key)?[0] != 0),
            8 => Value::String(self.string(&|| format!("value of {key:?}"))?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::TooLarge {
                        what: format!("array nesting of {key:?}"),
                        value: depth.into(),
                        limit: MAX_ARRAY_DEPTH.into(),
                    });
                }
                let ety = self.u32(&key)?;
                let n = self.u64(&key)?;
                cap(|| format!("array length of {key:?}"), n, MAX_ARRAY)?;
                // Every element takes at least one byte: a count beyond the bytes left is
                // a lie, caught before we reserve memory for it.
                if n > self.remaining() {
                    return Err(GgufError::Truncated {
                        what: format!("array {key:?} of {n} elements"),
                        start: self.pos as u64,
                        end: self.pos as u64 + n,
                        len: self.buf.len() as u64,
                    });
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(key, ety, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(&key)?),
            11 => Value::I64(i64::from_le_bytes(self.arr(&key)?)),
            12 => Value::F64(f64::from_le_bytes(self.arr(&key)?)),
            _ => {
                return Err(GgufError::BadValueType {
                    key: key.to_string(),
                    ty,
                })
            }
        })
    }
}

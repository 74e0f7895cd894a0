//! Model weights in safetensors files: one `model.safetensors`, shards listed by
//! `model.safetensors.index.json`, or every `*.safetensors` of a directory; and writing them.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors, View};
use serde_json::Value;
use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result, io_err, torch_err};

/// Where one tensor's bytes are.
struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<i64>,
    /// Byte range inside the mapped file.
    range: (usize, usize),
}

/// The weights of a model directory, mapped, with every tensor's location known.
pub struct WeightFiles {
    files: Vec<(PathBuf, Mmap)>,
    entries: HashMap<String, Entry>,
    /// The file errors about a missing tensor name: the index, the one file, or the directory.
    named_by: PathBuf,
}

impl WeightFiles {
    /// Finds and maps the weights of `dir`.
    pub fn open(dir: &Path) -> Result<WeightFiles> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(io_err(&index))?;
            let json: Value = serde_json::from_str(&text)
                .map_err(|source| ModelError::Json { file: index.clone(), source })?;
            let map = json.get("weight_map").and_then(Value::as_object).ok_or_else(|| {
                ModelError::MissingField { file: index.clone(), field: "weight_map".into() }
            })?;
            // name -> shard, as the index says; a shard may hold more than it lists.
            let mut wanted: BTreeMap<String, String> = BTreeMap::new();
            for (name, file) in map {
                let file = file.as_str().ok_or_else(|| ModelError::InvalidField {
                    file: index.clone(),
                    field: format!("weight_map.{name}"),
                    message: "expected a file name".into(),
                })?;
                if file.contains('/') || file.contains("..") {
                    return Err(ModelError::InvalidField {
                        file: index.clone(),
                        field: format!("weight_map.{name}"),
                        message: format!("shard \"{file}\" is not a file of the model directory"),
                    });
                }
                wanted.insert(name.clone(), file.to_owned());
            }
            let mut shards: Vec<&String> = wanted.values().collect();
            shards.sort();
            shards.dedup();
            let paths: Vec<PathBuf> = shards.iter().map(|s| dir.join(s)).collect();
            let mut weights = Self::map_files(paths, index.clone())?;
            // Every name of the index must be in the shard it names.
            for (name, shard) in &wanted {
                let shard_path = dir.join(shard);
                match weights.entries.get(name) {
                    Some(e) if weights.files[e.file].0 == shard_path => {}
                    _ => return Err(ModelError::MissingTensor { name: name.clone(), file: shard_path }),
                }
            }
            weights.named_by = index;
            Ok(weights)
        } else if single.is_file() {
            Self::map_files(vec![single.clone()], single)
        } else {
            let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(io_err(dir))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors") && p.is_file())
                .collect();
            if paths.is_empty() {
                return Err(ModelError::NoWeights { dir: dir.to_owned() });
            }
            paths.sort();
            Self::map_files(paths, dir.to_owned())
        }
    }

    /// Maps one safetensors file.
    pub fn open_file(path: &Path) -> Result<WeightFiles> {
        Self::map_files(vec![path.to_owned()], path.to_owned())
    }

    fn map_files(paths: Vec<PathBuf>, named_by: PathBuf) -> Result<WeightFiles> {
        let mut files = Vec::with_capacity(paths.len());
        let mut entries = HashMap::new();
        for (i, path) in paths.into_iter().enumerate() {
            let file = File::open(&path).map_err(|source| {
                if source.kind() == std::io::ErrorKind::NotFound {
                    ModelError::MissingFile { path: path.clone() }
                } else {
                    ModelError::Io { path: path.clone(), source }
                }
            })?;
            // SAFETY: the map is read-only and lives as long as `WeightFiles`. A model file
            // truncated or rewritten by someone else while we load is undefined behaviour that
            // no reader of a mapped file can rule out; model directories are written once and
            // renamed into place (see `save_pretrained`), never modified in place.
            let map = unsafe { Mmap::map(&file) }.map_err(io_err(&path))?;
            let (header_len, metadata) = SafeTensors::read_metadata(&map)
                .map_err(|e| ModelError::Safetensors { file: path.clone(), message: e.to_string() })?;
            let base = 8 + header_len;
            for (name, info) in metadata.tensors() {
                let shape = info.shape.iter().map(|&d| d as i64).collect();
                let range = (base + info.data_offsets.0, base + info.data_offsets.1);
                entries.insert(name, Entry { file: i, dtype: info.dtype, shape, range });
            }
            files.push((path, map));
        }
        Ok(WeightFiles { files, entries, named_by })
    }

    /// Whether a tensor of that name is stored.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The shape of tensor `name`, if stored.
    pub fn shape(&self, name: &str) -> Option<&[i64]> {
        self.entries.get(name).map(|entry| entry.shape.as_slice())
    }

    /// The names of every stored tensor.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Tensor `name`, checked against `shape`, converted to `kind` on `device`.
    pub fn get(&self, name: &str, shape: &[i64], device: Device, kind: Kind) -> Result<Tensor> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.into(), file: self.named_by.clone() })?;
        let file = &self.files[entry.file].0;
        if entry.shape != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.into(),
                file: file.clone(),
                expected: shape.to_vec(),
                found: entry.shape.clone(),
            });
        }
        let stored = match entry.dtype {
            Dtype::F32 => Kind::Float,
            Dtype::BF16 => Kind::BFloat16,
            Dtype::F16 => Kind::Half,
            Dtype::F64 => Kind::Double,
            other => {
                return Err(ModelError::UnsupportedDtype {
                    name: name.into(),
                    file: file.clone(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        let map = &self.files[entry.file].1;
        let bytes = &map[entry.range.0..entry.range.1];
        let t = Tensor::f_from_data_size(bytes, shape, stored)
            .map_err(torch_err(format!("tensor {name} in {}", file.display())))?;
        // The tensor owns a copy now: its pages of the mapping leave this process's resident
        // memory, so loading a model (or a resume's optimizer state) holds one tensor of the
        // file at a time beside what it loaded, not the whole file. Advice only: on failure the
        // pages stay until the mapping is dropped.
        // SAFETY: a read-only file mapping nothing writes; a later read of those pages faults them in
        // again from the file, unchanged.
        let _ = unsafe {
            map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                entry.range.0,
                entry.range.1 - entry.range.0,
            )
        };
        Ok(t.to_device(device).to_kind(kind))
    }
}

/// A CPU, contiguous tensor seen by the safetensors writer.
struct CpuView {
    tensor: Tensor,
    dtype: Dtype,
    shape: Vec<usize>,
}

impl View for CpuView {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        let mut bytes = vec![0u8; self.data_len()];
        self.tensor.copy_data_u8(&mut bytes, self.tensor.numel());
        bytes.into()
    }
    fn data_len(&self) -> usize {
        self.tensor.numel() * self.tensor.kind().elt_size_in_bytes()
    }
}

/// Writes `tensors` to one safetensors file with `{"format": "pt"}` metadata (what
/// transformers expects), each contiguous, in its own dtype.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let mut views = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let tensor = t.detach().to_device(Device::Cpu).contiguous();
        let dtype = match tensor.kind() {
            Kind::Float => Dtype::F32,
            Kind::BFloat16 => Dtype::BF16,
            Kind::Half => Dtype::F16,
            Kind::Double => Dtype::F64,
            other => {
                return Err(ModelError::UnsupportedDtype {
                    name: name.clone(),
                    file: path.to_owned(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        let shape = tensor.size().iter().map(|&d| d as usize).collect();
        views.push((name.clone(), CpuView { tensor, dtype, shape }));
    }
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), path).map_err(|e| match e {
        // A full disk or a read-only directory: the OS error as it is, `(os error 28)` and all.
        safetensors::SafeTensorError::IoError(source) => ModelError::Io { path: path.to_owned(), source },
        other => ModelError::Safetensors { file: path.to_owned(), message: other.to_string() },
    })
}

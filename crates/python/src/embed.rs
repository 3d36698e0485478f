//! `oxgen.Embedder`: an encoder package (a sentence encoder or a cross-encoder), what
//! `oxgen.Model(path)` gives for one, or a decoder package embedding from its final hidden
//! states. Embeddings come back as one NumPy float32 array.

use std::path::PathBuf;
use std::sync::Mutex;

use numpy::{PyArray1, PyArrayMethods};
use oxgen::embed::is_encoder_package;
use oxgen::{EmbedInput, EmbedOptions, Embedder, EncoderKind, Pooling};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::{GenerationError, ModelLoadError, backend_named, invalid};

/// An encoder package: `embed` texts into unit vectors (as its sentence-transformers config
/// says), or `rerank` documents against a query. Methods may be called from several
/// threads; one runs at a time.
#[pyclass(name = "Embedder", module = "oxgen", frozen)]
pub struct PyEmbedder {
    inner: Mutex<Embedder>,
    path: String,
    kind: EncoderKind,
    dim: usize,
    max_tokens: usize,
    backend: &'static str,
}

/// `texts` as inputs: a string, a list of strings, a list of token ids, or a list of such
/// lists.
fn inputs(texts: &Bound<'_, PyAny>) -> PyResult<Vec<EmbedInput>> {
    if let Ok(text) = texts.extract::<String>() {
        return Ok(vec![EmbedInput::Text(text)]);
    }
    let shape = "texts must be a string, a list of strings, a list of token ids or a list of \
                 lists of token ids";
    let list = texts.cast::<PyList>().map_err(|_| invalid(shape))?;
    if list.is_empty() {
        return Err(invalid("texts is an empty list"));
    }
    if let Ok(ids) = list.extract::<Vec<u32>>() {
        return Ok(vec![EmbedInput::Ids(ids)]);
    }
    (list.iter().enumerate())
        .map(|(i, item)| {
            if let Ok(text) = item.extract::<String>() {
                Ok(EmbedInput::Text(text))
            } else if let Ok(ids) = item.extract::<Vec<u32>>() {
                Ok(EmbedInput::Ids(ids))
            } else {
                Err(invalid(format!("texts[{i}]: {shape}")))
            }
        })
        .collect()
}

#[pymethods]
impl PyEmbedder {
    #[new]
    #[pyo3(signature = (path, *, backend = "auto", threads = 0, ort_lib = None, pooling = None,
                        normalize = None, max_tokens = None))]
    // The parameters are Python's keyword arguments, named by the signature above.
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: String,
        backend: &str,
        threads: usize,
        ort_lib: Option<PathBuf>,
        pooling: Option<&str>,
        normalize: Option<bool>,
        max_tokens: Option<usize>,
    ) -> PyResult<PyEmbedder> {
        let backend = backend_named(backend)?;
        let pooling = pooling
            .map(|p| {
                Pooling::parse(p)
                    .ok_or_else(|| invalid(format!("pooling '{p}': use {}", Pooling::NAMES)))
            })
            .transpose()?;
        let options = EmbedOptions {
            threads,
            backend,
            ort_lib,
            pooling,
            normalize,
            max_tokens,
        };
        let embedder = py
            .detach(|| Embedder::open(path.as_ref(), &options))
            .map_err(|e| ModelLoadError::new_err(format!("opening {path}: {e}")))?;
        Ok(PyEmbedder {
            kind: embedder.kind(),
            dim: embedder.dim(),
            max_tokens: embedder.tokenizer().max_tokens(),
            backend: embedder.backend(),
            inner: Mutex::new(embedder),
            path,
        })
    }

    /// The embeddings of `texts` (a string, a list of strings, token ids or lists of them)
    /// as a float32 array of shape `(len(texts), dim)`; an input longer than `max_tokens`
    /// is an error unless `truncate`.
    #[pyo3(signature = (texts, *, truncate = false))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        texts: &Bound<'py, PyAny>,
        truncate: bool,
    ) -> PyResult<Bound<'py, numpy::PyArray2<f32>>> {
        let inputs = inputs(texts)?;
        let n = inputs.len();
        // The lock is taken with the GIL released: the thread holding it needs the GIL back
        // when it is done.
        let vectors = py.detach(|| {
            let mut embedder = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let tokens = (inputs.iter().enumerate())
                .map(|(i, input)| embedder.tokenizer().input(i, input, truncate))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(format!("texts: {e}")))?;
            (embedder.embed_tokens(&tokens)).map_err(|e| GenerationError::new_err(e.to_string()))
        })?;
        let flat: Vec<f32> = vectors.into_iter().flatten().collect();
        PyArray1::from_vec(py, flat).reshape([n, self.dim])
    }

    /// The relevance of each document to `query`, in the documents' order: a
    /// cross-encoder's score in [0, 1], or the cosine of an embedding model's vectors.
    #[pyo3(signature = (query, documents, *, truncate = false))]
    fn rerank(
        &self,
        py: Python<'_>,
        query: &str,
        documents: Vec<String>,
        truncate: bool,
    ) -> PyResult<Vec<f32>> {
        if documents.is_empty() {
            return Err(invalid("documents is an empty list"));
        }
        py.detach(|| {
            let mut embedder = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let tokens = (embedder.tokenizer().rerank(query, &documents, truncate))
                .map_err(|e| invalid(format!("documents: {e}")))?;
            (embedder.rerank_tokens(&tokens)).map_err(|e| GenerationError::new_err(e.to_string()))
        })
    }

    /// The ids `text` runs as, special tokens included (cut to `max_tokens` as
    /// `truncate=True` cuts it).
    fn tokenize(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u32>> {
        py.detach(|| {
            let embedder = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let input = EmbedInput::Text(text.to_string());
            (embedder.tokenizer().input(0, &input, true))
                .map(|t| t.ids)
                .map_err(|e| invalid(format!("text: {e}")))
        })
    }

    /// Values per embedding (a reranker's: its logits).
    #[getter]
    fn dim(&self) -> usize {
        self.dim
    }

    /// `"embedding"` or `"rerank"`.
    #[getter]
    fn kind(&self) -> &'static str {
        match self.kind {
            EncoderKind::Embedding { .. } => "embedding",
            EncoderKind::Reranker { .. } => "rerank",
        }
    }

    /// Tokens an input may hold, special tokens included.
    #[getter]
    fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    fn __repr__(&self) -> String {
        format!(
            "oxgen.Embedder({:?}, kind={}, dim={}, backend={})",
            self.path,
            self.kind(),
            self.dim,
            self.backend
        )
    }
}

/// Whether the folder holds an encoder package (what `oxgen.Model(path)` opens as an
/// `Embedder`).
#[pyfunction]
pub fn is_encoder(path: PathBuf) -> bool {
    is_encoder_package(&path)
}

//! `oxgen inspect MODEL`: what a model file holds and whether the native backend can run it.
//!
//! Reads the protobuf directly (not the graph IR) so it also describes models the native
//! backend cannot load.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use oxgen_onnx::proto::{self, tensor_shape_proto::dimension, type_proto};
use oxgen_tensor::DType;
use serde::Serialize;

#[derive(clap::Args)]
pub struct Args {
    /// A `.onnx` file, or a package folder holding `model.onnx`.
    model: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long, env = "OXGEN_JSON")]
    json: bool,
    /// ONNX Runtime's shared library, asked to load a graph native cannot (as `--backend
    /// auto` would); else ORT_DYLIB_PATH, else the one Python's onnxruntime package ships.
    #[arg(long, env = "OXGEN_ORT_LIB")]
    ort_lib: Option<PathBuf>,
}

#[derive(Serialize)]
struct Io {
    name: String,
    dtype: String,
    shape: Option<Vec<String>>,
}

#[derive(Serialize)]
struct ExternalFile {
    path: String,
    file_bytes: u64,
    referenced_bytes: u64,
    warning: Option<String>,
}

#[derive(Serialize)]
struct Report {
    path: String,
    ir_version: i64,
    producer: String,
    opsets: BTreeMap<String, i64>,
    nodes: usize,
    /// domain → op_type → count
    ops: BTreeMap<String, BTreeMap<String, usize>>,
    inputs: Vec<Io>,
    outputs: Vec<Io>,
    initializers: usize,
    initializer_bytes: u64,
    external_files: Vec<ExternalFile>,
    /// `domain::op_type` the native backend has no kernel for.
    native_unsupported: Vec<String>,
    /// What `--backend auto` picks (`native` or `ort`) and why.
    auto_backend: AutoBackend,
}

#[derive(Serialize)]
struct AutoBackend {
    backend: &'static str,
    why: String,
}

fn io(v: &proto::ValueInfoProto) -> Io {
    let tensor = match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => Some(t),
        _ => None,
    };
    let dtype = match tensor.and_then(|t| t.elem_type) {
        Some(code) => DType::from_onnx(code).map_or_else(
            || DType::onnx_name(code).to_lowercase(),
            |d| d.name().to_string(),
        ),
        None => "non-tensor".to_string(),
    };
    let shape = tensor.and_then(|t| t.shape.as_ref()).map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(dimension::Value::DimValue(v)) => v.to_string(),
                Some(dimension::Value::DimParam(p)) => p.clone(),
                None => "?".into(),
            })
            .collect()
    });
    Io {
        name: v.name().to_string(),
        dtype,
        shape,
    }
}

/// Bytes a tensor's data occupies, from its dims and dtype (0 when unknown).
pub(crate) fn tensor_bytes(t: &proto::TensorProto) -> u64 {
    let numel = t.dims.iter().try_fold(1u64, |acc, &d| {
        u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    });
    let bits = DType::from_onnx(t.data_type()).map_or(0, |d| d.bits() as u64);
    numel.map_or(0, |n| (n * bits).div_ceil(8))
}

fn report(args: &Args) -> anyhow::Result<Report> {
    let model = oxgen_onnx::Model::load(&args.model)
        .with_context(|| format!("inspecting {}", args.model.display()))?;
    let m = model.proto();
    let g = model.graph();
    let mut ops: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for node in &g.node {
        let domain = if node.domain().is_empty() {
            "ai.onnx"
        } else {
            node.domain()
        };
        *ops.entry(domain.to_string())
            .or_default()
            .entry(node.op_type().to_string())
            .or_default() += 1;
    }
    let auto = oxgen::auto_choice(model.path().unwrap_or(&args.model), args.ort_lib.as_deref())
        .with_context(|| format!("inspecting {}", args.model.display()))?;
    let init_names: std::collections::HashSet<&str> =
        g.initializer.iter().map(|i| i.name()).collect();
    let external_files = model
        .external_files()
        .into_iter()
        .map(|f| {
            // A data file much larger than what the initializers use usually means it was
            // written for another graph (or a pruned one) and wastes disk and page cache.
            let slack = f.file_size.saturating_sub(f.bytes_referenced);
            let warning = (slack > (1 << 20) && slack > f.bytes_referenced / 10).then(|| {
                format!(
                    "file holds {} bytes but initializers use only {}: {} bytes unused",
                    f.file_size, f.bytes_referenced, slack
                )
            });
            ExternalFile {
                path: f.path.display().to_string(),
                file_bytes: f.file_size,
                referenced_bytes: f.bytes_referenced,
                warning,
            }
        })
        .collect();
    let opsets = model
        .opsets()
        .iter()
        .map(|(d, v)| {
            (
                if d.is_empty() {
                    "ai.onnx".to_string()
                } else {
                    d.clone()
                },
                *v,
            )
        })
        .collect();
    Ok(Report {
        path: model.path().map_or_else(
            || args.model.display().to_string(),
            |p| p.display().to_string(),
        ),
        ir_version: m.ir_version(),
        producer: format!("{} {}", m.producer_name(), m.producer_version())
            .trim()
            .to_string(),
        opsets,
        nodes: g.node.len(),
        ops,
        inputs: g
            .input
            .iter()
            .filter(|i| !init_names.contains(i.name()))
            .map(io)
            .collect(),
        outputs: g.output.iter().map(io).collect(),
        initializers: g.initializer.len(),
        initializer_bytes: g.initializer.iter().map(tensor_bytes).sum(),
        external_files,
        native_unsupported: auto.native_unsupported,
        auto_backend: AutoBackend {
            backend: auto.backend,
            why: auto.why,
        },
    })
}

pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

fn print_io(title: &str, list: &[Io]) {
    println!("{title}:");
    for v in list {
        let shape = v
            .shape
            .as_ref()
            .map_or("(no shape)".to_string(), |s| format!("[{}]", s.join(", ")));
        println!("  {:<32} {:<9} {shape}", v.name, v.dtype);
    }
}

/// Prints the report; fails (after printing it) when no backend can run the model.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let r = report(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_report(&r);
    }
    if r.auto_backend.backend == "none" {
        anyhow::bail!(
            "no backend can run {}: {}",
            args.model.display(),
            r.auto_backend.why
        );
    }
    Ok(())
}

fn print_report(r: &Report) {
    println!("model:        {}", r.path);
    println!(
        "ir_version:   {}   producer: {}",
        r.ir_version,
        if r.producer.is_empty() {
            "-"
        } else {
            &r.producer
        }
    );
    let opsets: Vec<String> = r.opsets.iter().map(|(d, v)| format!("{d} {v}")).collect();
    println!("opsets:       {}", opsets.join(", "));
    print_io("inputs", &r.inputs);
    print_io("outputs", &r.outputs);
    println!(
        "initializers: {} ({})",
        r.initializers,
        human(r.initializer_bytes)
    );
    for f in &r.external_files {
        println!(
            "  external data {}: {} on disk, {} referenced",
            f.path,
            human(f.file_bytes),
            human(f.referenced_bytes)
        );
        if let Some(w) = &f.warning {
            eprintln!("warning: {}: {w}", f.path);
        }
    }
    println!("nodes:        {}", r.nodes);
    for (domain, ops) in &r.ops {
        let mut sorted: Vec<(&String, &usize)> = ops.iter().collect();
        sorted.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let list: Vec<String> = sorted.iter().map(|(op, n)| format!("{op} {n}")).collect();
        println!("  {domain}: {}", list.join(", "));
    }
    if r.native_unsupported.is_empty() {
        println!("native:       every op has a kernel");
    } else {
        println!(
            "native:       no kernel for {}",
            r.native_unsupported.join(", ")
        );
    }
    if r.auto_backend.backend == "none" {
        println!("backend:      none can run it");
    } else {
        println!(
            "backend:      auto runs it on {} ({})",
            r.auto_backend.backend, r.auto_backend.why
        );
    }
}

//! The ONNX backend node-test suite on the native backend, and through ONNX Runtime as a
//! check of the runner itself.
//!
//! Runs every case under `$OXGEN_ONNX_NODE_TESTS` (set by `scripts/test.sh`, which extracts
//! them from the pinned `onnx` wheel) in its own `oxgen-node-test` process with a timeout,
//! then checks:
//! - every case in `conformance/passing.txt` passes (the manifest only grows);
//! - no case panics, crashes or hangs;
//! - every case built only from the ops the foundation promises either passes or is listed
//!   in `conformance/unsupported.txt` with a reason.
//!
//! Prints `conformance: N passed, M failed` over all cases. `OXGEN_UPDATE_CONFORMANCE=1`
//! adds the cases that pass now to `passing.txt`. It never drops one that stopped passing:
//! that stays a failure unless the case is named, with a reason, in
//! `OXGEN_CONFORMANCE_DROP="case=reason;case=reason"`; a dropped case moves to
//! `unsupported.txt` with its reason.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use oxgen_testkit::node_tests::Outcome;

/// A case that runs longer than this is a hang.
const CASE_TIMEOUT: Duration = Duration::from_secs(60);

/// The ops issue #2 promises, by `op_type` in the default domain.
const FOUNDATION_OPS: &str = "Add Sub Mul Div Pow Sqrt Reciprocal Exp Log Neg Abs Erf Tanh Sigmoid Relu Gelu \
    Softmax LogSoftmax MatMul Gemm Cast Reshape Transpose Gather GatherElements Unsqueeze Squeeze Concat Split \
    Slice Expand Shape Size ConstantOfShape Constant Range Where Equal Less Greater LessOrEqual GreaterOrEqual \
    And Or Not Trilu ReduceMean ReduceSum ReduceMax CumSum ScatterND LayerNormalization RMSNormalization \
    Identity IsNaN Max Min Clip Tile TopK ArgMax Mod Floor Ceil Sin Cos Flatten";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Result_ {
    Outcome(Outcome),
    Timeout,
    Crash(String),
}

fn manifest_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance")
}

/// Non-empty, non-comment lines: the first word, and the rest.
fn read_list(file: &str) -> BTreeMap<String, String> {
    let path = manifest_dir().join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(|l| match l.split_once(char::is_whitespace) {
            Some((name, rest)) => (name.to_string(), rest.trim().to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect()
}

/// The cases `OXGEN_CONFORMANCE_DROP` names to leave `passing.txt` (`case=reason;...`), each
/// with its reason; only read when updating.
fn dropped_cases(update: bool) -> BTreeMap<String, String> {
    let Some(spec) = std::env::var_os("OXGEN_CONFORMANCE_DROP") else {
        return BTreeMap::new();
    };
    assert!(
        update,
        "OXGEN_CONFORMANCE_DROP only applies with OXGEN_UPDATE_CONFORMANCE=1"
    );
    spec.to_string_lossy()
        .split(';')
        .filter(|s| !s.trim().is_empty())
        .map(|item| match item.split_once('=') {
            Some((case, reason)) if !reason.trim().is_empty() => {
                (case.trim().to_string(), reason.trim().to_string())
            }
            _ => panic!("OXGEN_CONFORMANCE_DROP: {item:?} needs a reason: case=why it may fail"),
        })
        .collect()
}

fn tolerance_args(overrides: &BTreeMap<String, String>, case: &str) -> Vec<String> {
    overrides
        .get(case)
        .map(|v| v.split_whitespace().take(2).map(String::from).collect())
        .unwrap_or_default()
}

/// Runs one case in its own process; `ort`: through ONNX Runtime loaded from that library.
fn run_one(case: &Path, ort: Option<&Path>, tol: &[String]) -> Result_ {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oxgen-node-test"));
    if let Some(lib) = ort {
        // Located once by the parent: asking Python in every case would cost more than the case.
        cmd.arg("--ort").env("ORT_DYLIB_PATH", lib);
    }
    let mut child = cmd
        .arg(case)
        .args(tol)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the oxgen-node-test binary starts");
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() > CASE_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Result_::Timeout;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Result_::Crash(e.to_string()),
        }
    }
    let out = child
        .wait_with_output()
        .expect("collecting the child's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    match serde_json::from_str::<Outcome>(stdout.trim()) {
        Ok(Outcome::Fail(why)) if why.starts_with("panicked") => Result_::Crash(format!(
            "panic: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        )),
        Ok(o) => Result_::Outcome(o),
        Err(_) => Result_::Crash(format!(
            "exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// The default-domain op types a case's model uses.
fn case_ops(case: &Path) -> Option<BTreeSet<String>> {
    let model = oxgen_onnx::Model::load(case.join("model.onnx")).ok()?;
    Some(
        model
            .graph()
            .node
            .iter()
            .map(|n| format!("{}::{}", n.domain(), n.op_type()))
            .collect(),
    )
}

/// Every case folder under `$OXGEN_ONNX_NODE_TESTS`, sorted.
fn all_cases() -> (PathBuf, Vec<String>) {
    let Some(root) = std::env::var_os("OXGEN_ONNX_NODE_TESTS") else {
        panic!(
            "OXGEN_ONNX_NODE_TESTS is not set: run the suite with scripts/test.sh, which fetches the onnx wheel's node tests"
        );
    };
    let root = PathBuf::from(root);
    let mut cases: Vec<String> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("reading {}: {e}", root.display()))
        .flatten()
        .filter(|e| e.path().join("model.onnx").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    cases.sort();
    assert!(
        cases.len() > 1000,
        "{} holds only {} cases; is it the node-test folder?",
        root.display(),
        cases.len()
    );
    (root, cases)
}

/// Runs every case, a few processes at a time.
fn run_all(
    root: &Path,
    cases: &[String],
    ort: Option<&Path>,
    tolerances: &BTreeMap<String, String>,
) -> BTreeMap<String, Result_> {
    let results: Mutex<BTreeMap<String, Result_>> = Mutex::new(BTreeMap::new());
    let next = Mutex::new(0usize);
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(4);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let i = {
                        let mut n = next.lock().unwrap();
                        *n += 1;
                        *n - 1
                    };
                    let Some(case) = cases.get(i) else { break };
                    let r = run_one(&root.join(case), ort, &tolerance_args(tolerances, case));
                    results.lock().unwrap().insert(case.clone(), r);
                }
            });
        }
    });
    results.into_inner().unwrap()
}

/// ONNX Runtime should pass nearly every case it can load; if it does not, the runner (input
/// binding, tensor files, comparison) is wrong, not the native backend. Cases it cannot load
/// (ops it lacks, training ops, string or float8 tensors the runner does not read) are counted
/// apart.
#[test]
fn onnx_node_tests_through_onnxruntime() {
    let (root, cases) = all_cases();
    let tolerances = read_list("tolerances.txt");
    let lib = oxgen_ort::locate_library(None).unwrap_or_else(|e| panic!("{e}"));
    let results = run_all(&root, &cases, Some(&lib), &tolerances);
    let count = |f: &dyn Fn(&Result_) -> bool| results.values().filter(|r| f(r)).count();
    let passed = count(&|r| *r == Result_::Outcome(Outcome::Pass));
    let unloadable = count(&|r| matches!(r, Result_::Outcome(Outcome::Unsupported(_))));
    let failed: Vec<String> = results
        .iter()
        .filter(|(_, r)| !matches!(r, Result_::Outcome(Outcome::Pass | Outcome::Unsupported(_))))
        .map(|(c, r)| format!("{c}: {r:?}"))
        .collect();
    eprintln!(
        "conformance (onnxruntime): {passed} passed, {} failed, {unloadable} not loadable",
        failed.len()
    );
    for f in &failed {
        eprintln!("  {}", f.chars().take(300).collect::<String>());
    }
    // A library that never loads would make every case "not loadable".
    assert!(
        passed >= 1000,
        "onnxruntime passes only {passed} cases: is its library loading?"
    );
    assert!(
        failed.len() * 100 <= (passed + failed.len()) * 2,
        "onnxruntime fails {} of the {} cases it loads through the runner",
        failed.len(),
        passed + failed.len()
    );
}

#[test]
fn onnx_node_tests() {
    let (root, cases) = all_cases();
    let passing = read_list("passing.txt");
    let unsupported = read_list("unsupported.txt");
    let tolerances = read_list("tolerances.txt");
    let results = run_all(&root, &cases, None, &tolerances);

    let passed: BTreeSet<&String> = results
        .iter()
        .filter(|(_, r)| **r == Result_::Outcome(Outcome::Pass))
        .map(|(c, _)| c)
        .collect();
    let update = std::env::var_os("OXGEN_UPDATE_CONFORMANCE").is_some();
    let drop = dropped_cases(update);
    let mut problems = Vec::new();
    for case in passing.keys() {
        match results.get(case) {
            Some(Result_::Outcome(Outcome::Pass)) => {}
            Some(_) if drop.contains_key(case) => {}
            Some(other) => problems.push(format!("{case} is in passing.txt but now: {other:?}")),
            None => problems.push(format!(
                "{case} is in passing.txt but not in {}",
                root.display()
            )),
        }
    }
    for (case, r) in &results {
        match r {
            Result_::Timeout => problems.push(format!("{case}: timed out after {CASE_TIMEOUT:?}")),
            Result_::Crash(why) => problems.push(format!("{case}: crashed: {why}")),
            _ => {}
        }
    }
    let foundation: BTreeSet<String> = FOUNDATION_OPS
        .split_whitespace()
        .map(|o| format!("::{o}"))
        .collect();
    for (case, r) in &results {
        if passed.contains(case) || unsupported.contains_key(case) {
            continue;
        }
        if case_ops(&root.join(case))
            .is_some_and(|ops| !ops.is_empty() && ops.is_subset(&foundation))
        {
            problems.push(format!(
                "{case} uses only foundation ops but fails and is not in unsupported.txt: {r:?}"
            ));
        }
    }
    for case in unsupported.keys() {
        if passed.contains(case) {
            problems.push(format!("{case} passes now: remove it from unsupported.txt"));
        }
    }
    for (case, reason) in &unsupported {
        if reason.is_empty() {
            problems.push(format!("{case} in unsupported.txt needs a reason"));
        }
    }

    let new: Vec<&&String> = passed
        .iter()
        .filter(|c| !passing.contains_key(**c))
        .collect();
    for case in drop.keys() {
        if passed.contains(case) || !passing.contains_key(case) {
            problems.push(format!(
                "{case} is named in OXGEN_CONFORMANCE_DROP but is not a passing.txt case that \
                 fails now"
            ));
        }
    }
    if update && problems.is_empty() {
        // What passed before stays listed (a regression is a failure above, not an edit);
        // only the cases named to drop leave, into unsupported.txt with their reasons.
        let kept = passing.keys().filter(|c| !drop.contains_key(*c));
        let all: BTreeSet<&String> = kept.chain(passed.iter().copied()).collect();
        let text: String = all.iter().map(|c| format!("{c}\n")).collect();
        let header = "# ONNX node-test cases the native backend passes (onnx 1.22.0 wheel).\n# Only grows; OXGEN_UPDATE_CONFORMANCE=1 scripts/test.sh adds new passes (see tests/conformance.rs).\n";
        std::fs::write(
            manifest_dir().join("passing.txt"),
            format!("{header}{text}"),
        )
        .expect("writing passing.txt");
        if !drop.is_empty() {
            let path = manifest_dir().join("unsupported.txt");
            let mut text = std::fs::read_to_string(&path).expect("reading unsupported.txt");
            for (case, reason) in &drop {
                text.push_str(&format!("{case}  {reason} (dropped from passing.txt)\n"));
            }
            std::fs::write(&path, text).expect("writing unsupported.txt");
        }
    } else if !new.is_empty() {
        eprintln!(
            "{} cases pass but are not in passing.txt (add them: OXGEN_UPDATE_CONFORMANCE=1): {new:?}",
            new.len()
        );
    }
    eprintln!(
        "conformance: {} passed, {} failed",
        passed.len(),
        results.len() - passed.len()
    );
    assert!(
        problems.is_empty(),
        "{} conformance problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

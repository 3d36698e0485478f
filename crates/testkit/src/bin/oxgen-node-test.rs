//! Runs one ONNX node-test case on the native backend (or ONNX Runtime) and prints its
//! outcome as one JSON line. The conformance suite starts one process per case so a hang or a
//! crash is contained.
//!
//! Usage: `oxgen-node-test [--ort] CASE_DIR [RTOL ATOL]`

use std::path::Path;

use oxgen_testkit::compare::Tolerance;
use oxgen_testkit::node_tests::{Outcome, native_session, ort_session, run_case};

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    let ort = args.get(1).is_some_and(|a| a == "--ort");
    if ort {
        args.remove(1);
    }
    let Some(case) = args.get(1) else {
        eprintln!("usage: oxgen-node-test [--ort] CASE_DIR [RTOL ATOL]");
        std::process::exit(2);
    };
    let mut tol = Tolerance::ONNX;
    if let (Some(r), Some(a)) = (args.get(2), args.get(3)) {
        match (r.parse(), a.parse()) {
            (Ok(rtol), Ok(atol)) => tol = Tolerance { rtol, atol },
            _ => {
                eprintln!("RTOL and ATOL must be numbers, got '{r}' '{a}'");
                std::process::exit(2);
            }
        }
    }
    let factory = if ort { ort_session } else { native_session };
    let outcome = std::panic::catch_unwind(|| run_case(Path::new(case), &factory, tol))
        .unwrap_or_else(|_| Outcome::Fail("panicked (see stderr)".into()));
    println!(
        "{}",
        serde_json::to_string(&outcome).expect("an outcome serializes")
    );
}

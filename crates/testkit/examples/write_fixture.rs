//! Writes a fixture package: `cargo run -p oxgen-testkit --example write_fixture -- DIR`.

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| {
        eprintln!("usage: write_fixture DIR");
        std::process::exit(2)
    });
    oxgen_testkit::fixtures::write_package(std::path::Path::new(&dir), &Default::default())
        .unwrap_or_else(|e| {
            eprintln!("error: writing {dir}: {e}");
            std::process::exit(1)
        });
}

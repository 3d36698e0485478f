//! oxgen-cli: The oxgen command-line tool
fn main() {}

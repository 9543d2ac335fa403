//! Regenerates `proto/src/gen/` from `proto/proto/` (`make proto`, which empties the
//! generated file first: this binary links the library that includes it).

#[path = "../codegen.rs"]
mod codegen;

fn main() -> std::io::Result<()> {
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join("gen");
    codegen::generate(&out)?;
    println!("wrote {}", out.join("scaleagent.v1.rs").display());
    Ok(())
}

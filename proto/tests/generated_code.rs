//! The checked-in generated code matches the `.proto` files.

#[path = "../src/codegen.rs"]
mod codegen;

#[test]
fn generated_code_is_up_to_date() {
    let out = std::env::temp_dir().join(format!("scale-agent-protogen-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    codegen::generate(&out).unwrap();
    let fresh = std::fs::read_to_string(out.join("scaleagent.v1.rs")).unwrap();
    let checked_in = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/gen/scaleagent.v1.rs"),
    )
    .unwrap();
    std::fs::remove_dir_all(&out).unwrap();
    assert!(
        fresh == checked_in,
        "proto/src/gen/scaleagent.v1.rs is out of date with proto/proto: run `make proto`"
    );
}

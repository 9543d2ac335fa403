//! Writes the CustomResourceDefinitions and a kustomization listing them into a directory
//! (default `manifests/crds`), and the field reference to `docs/crds.md` beside it (two levels
//! up: the repository root): `crdgen [DIR]`. Run through `make crds`.

use std::path::PathBuf;

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let dir = PathBuf::from(
        std::env::args_os()
            .nth(1)
            .unwrap_or_else(|| "manifests/crds".into()),
    );
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut files = scale_agent_crds::render_crds()?;
    let names: Vec<String> = files.iter().map(|(file, _)| file.clone()).collect();
    files.push(scale_agent_crds::render_kustomization(&names));
    for (file, yaml) in files {
        let path = dir.join(file);
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let reference = dir.join("../..").join(scale_agent_crds::REFERENCE_PATH);
    if let Some(docs) = reference.parent() {
        std::fs::create_dir_all(docs).with_context(|| format!("creating {}", docs.display()))?;
    }
    std::fs::write(
        &reference,
        scale_agent_crds::render_reference(&scale_agent_crds::crds()),
    )
    .with_context(|| format!("writing {}", reference.display()))?;
    println!("wrote {}", reference.display());
    Ok(())
}

//! Writes every target's seeds (`kudos_fuzz::seeds`) and saved regression inputs into
//! libFuzzer's corpus directories, `fuzz/libfuzzer/corpus/<target>/`, before a long run:
//!
//! ```text
//! cargo run -p kudos-fuzz --example write-seeds
//! ```

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for (name, _) in kudos_fuzz::TARGETS {
        let dir = root.join("libfuzzer/corpus").join(name);
        std::fs::create_dir_all(&dir)?;
        let seeds = kudos_fuzz::seeds::seeds(name);
        for (i, seed) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), seed)?;
        }
        let mut saved = 0;
        if let Ok(entries) = std::fs::read_dir(root.join("regressions").join(name)) {
            for e in entries.flatten() {
                std::fs::copy(e.path(), dir.join(e.file_name()))?;
                saved += 1;
            }
        }
        println!(
            "{name}: {} seeds, {saved} regression inputs -> {}",
            seeds.len(),
            dir.display()
        );
    }
    Ok(())
}

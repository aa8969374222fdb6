//! Every shipped search-space file validates, its defaults render as the bare command, and its
//! samples render with every placeholder replaced and no empty argv element (JSON-valued flags
//! stay one element each; nothing passes through a shell).

use rand::SeedableRng;
use servetune::space::Space;

#[test]
fn shipped_spaces_validate_and_render() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/search-spaces");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        n += 1;
        let s = Space::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(s.params.iter().all(|p| !p.source.is_empty()));
        let (argv, _) = s.render(&s.defaults(), "model.gguf", "127.0.0.1", 8080);
        assert_eq!(
            argv.len(),
            s.engine.argv.len() + s.engine.fixed.len(),
            "{argv:?}"
        );
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..200 {
            let cfg = s.sample(&mut rng).unwrap();
            let (argv, _) = s.render(&cfg, "model.gguf", "127.0.0.1", 8080);
            assert!(
                argv.iter().all(|a| !a.is_empty()
                    && !["{binary}", "{model}", "{host}", "{port}"]
                        .iter()
                        .any(|p| a.contains(p))),
                "{argv:?}"
            );
        }
    }
    assert!(n >= 1);
}

//! The allowed dependency directions between the crate's top-level modules, as
//! ARCHITECTURE.md states them, checked against every `crate::…` and `super::…` path in
//! `src/`. A new edge fails here until the document allows it, so the document stays true and
//! a layering mistake (production code reaching into the mock, `space` importing `engine`) is
//! caught in review rather than found later. The table itself has no cycle, and inside every
//! module the files (its child modules) do not depend on one another in a cycle either.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// `module -> modules it may use`, from the "Dependency directions" section.
fn allowed_from_doc(doc: &str) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let start = doc
        .find("\n## Dependency directions")
        .ok_or("ARCHITECTURE.md has no \"## Dependency directions\" section")?;
    let body = &doc[start + 1..];
    let body = body[2..].find("\n## ").map_or(body, |end| &body[..end + 2]);
    let mut allowed = BTreeMap::new();
    for line in body.lines().filter(|l| l.starts_with("- `")) {
        let (head, rest) = line
            .split_once(':')
            .ok_or_else(|| format!("no ':' in {line:?}"))?;
        let module = head.trim_start_matches("- ").trim_matches('`').to_owned();
        let uses: BTreeSet<String> = rest
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        if uses.is_empty() && !rest.trim_start().starts_with("nothing") {
            return Err(format!(
                "{line:?}: list modules in backticks, or say nothing"
            ));
        }
        allowed.insert(module, uses);
    }
    if allowed.is_empty() {
        return Err("the Dependency directions section lists no module".into());
    }
    Ok(allowed)
}

/// The code of a file without comments and without its `#[cfg(test)]` tail (unit tests may
/// use anything: the tokenizer's tests build prompts with the load generator's sampler).
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod "))
        {
            break;
        }
        let code = t.split("//").next().unwrap_or("");
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The other top-level modules the code of the file whose module is `at` names (`crate::x`,
/// `crate::{x, y::z}`, and `super::` chains that climb to the crate root): the first segment
/// of every path `named_paths` resolves.
fn used_modules(code: &str, at: &[String]) -> BTreeSet<String> {
    named_paths(code, at)
        .into_iter()
        .filter_map(|p| p.into_iter().next())
        .filter(|m| Some(m) != at.first())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Every edge of the crate that the document does not allow, as `file: a -> b`.
fn violations(src: &Path, allowed: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut bad = Vec::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("under src");
        let Some(at) = module_path(rel) else {
            continue;
        };
        let module = at[0].clone();
        let text = fs::read_to_string(&f).expect("readable source");
        let Some(ok) = allowed.get(&module) else {
            bad.push(format!(
                "{}: module `{module}` is not in ARCHITECTURE.md's Dependency directions",
                rel.display()
            ));
            continue;
        };
        for used in used_modules(&code_of(&text), &at) {
            if used != module && allowed.contains_key(&used) && !ok.contains(&used) {
                bad.push(format!("{}: {module} -> {used}", rel.display()));
            }
        }
    }
    bad
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_use_crate_follows_the_documented_directions() {
    let doc = fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let allowed = allowed_from_doc(&doc).unwrap();
    let bad = violations(&root().join("src"), &allowed);
    assert!(
        bad.is_empty(),
        "dependencies ARCHITECTURE.md does not allow:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_documented_modules_are_the_crates_modules() {
    let doc = fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let allowed = allowed_from_doc(&doc).unwrap();
    let lib = fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    let declared: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_owned())
        .collect();
    let documented: BTreeSet<String> = allowed.keys().cloned().collect();
    assert_eq!(declared, documented);
    for (m, uses) in &allowed {
        for u in uses {
            assert!(
                declared.contains(u),
                "{m} may use `{u}`, which is no module"
            );
        }
    }
}

/// The documented table allows no module to use the mock; the directions test holds the code
/// to the table, so together they keep every production path off the mock.
#[test]
fn the_table_allows_no_module_the_mock() {
    let doc = fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let allowed = allowed_from_doc(&doc).unwrap();
    let users: Vec<&String> = allowed
        .iter()
        .filter(|(_, uses)| uses.contains("mock"))
        .map(|(m, _)| m)
        .collect();
    assert!(
        users.is_empty(),
        "production modules allowed to use the mock: {users:?}"
    );
}

/// The files that own a tree of the store: the store itself and its typed layers (the tuner's
/// records, the daemon's queue and the scheduler's memory). Everyone else asks them.
const STORE_LAYERS: &[&str] = &[
    "store/mod.rs",
    "tune/records.rs",
    "daemon/queue.rs",
    "daemon/memory.rs",
];

/// The first raw store call in `code`, whitespace ignored (so that a call rustfmt split over
/// lines, `store\n    .get(`, is seen). A store reached through another name (`let s =
/// records.store(); s.get(…)`) is not: the check is a tripwire, not a proof.
fn raw_store_access(code: &str) -> Option<&'static str> {
    let flat: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    [
        ".scan::<",
        ".scan(",
        "store.get(",
        "store.get::<",
        "store.put(",
        "store.remove(",
        "store().get(",
        "store().get::<",
        "store().put(",
        "store().remove(",
    ]
    .into_iter()
    .find(|p| flat.contains(p))
}

#[test]
fn the_store_tripwire_sees_split_calls_and_ignores_comments() {
    assert_eq!(
        raw_store_access(&code_of("let x = d\n    .store\n    .get::<Job>(T, k);")),
        Some("store.get::<")
    );
    assert_eq!(
        raw_store_access(&code_of("self.records.store().remove(T, k)?;")),
        Some("store().remove(")
    );
    assert_eq!(
        raw_store_access(&code_of(
            "// d.store.put(T, k, v)\nlet y = records.trials(id)?;"
        )),
        None
    );
}

#[test]
fn only_the_typed_store_layers_touch_a_tree() {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut bad = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        if STORE_LAYERS.contains(&rel.as_str()) {
            continue;
        }
        let code = code_of(&fs::read_to_string(&f).unwrap());
        if let Some(p) = raw_store_access(&code) {
            bad.push(format!("{rel} ({p})"));
        }
    }
    assert!(
        bad.is_empty(),
        "raw store access outside the store's typed layers ({STORE_LAYERS:?}): {bad:?}"
    );
}

/// The checker itself: each way of naming a module is seen, comments and unit tests are not,
/// and an edge the table lacks is reported with its file.
#[test]
fn the_checker_sees_every_form_of_path() {
    let code = code_of(
        "use crate::space::Space;\nuse crate::{store::{Store, StoreError}, bench::stats};\nfn f() { super::super::engine::x(); }\n// crate::mock in a comment\nlet s = $crate::util;\n#[cfg(test)]\nmod tests { use crate::report; }\n",
    );
    // A file two levels down (`m::f`) of a module that is none of those named.
    let at = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let used = used_modules(&code, &at(&["m", "f"]));
    let expect: BTreeSet<String> = ["space", "store", "bench", "engine"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(used, expect);
    // One level of super:: from depth 2 stays inside the module.
    assert!(used_modules("super::sim::run();", &at(&["m", "f"])).is_empty());
    assert_eq!(
        used_modules("super::tune::x();", &at(&["m"])),
        BTreeSet::from(["tune".to_string()])
    );

    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("space")).unwrap();
    fs::write(
        dir.path().join("space/mod.rs"),
        "use crate::engine::launch::Ladder;\n",
    )
    .unwrap();
    fs::write(dir.path().join("engine.rs"), "use crate::space::Space;\n").unwrap();
    let allowed = allowed_from_doc(
        "x\n## Dependency directions\n- `space`: nothing\n- `engine`: `space`\n## Next\n- `other`: `space`\n",
    )
    .unwrap();
    assert_eq!(allowed.len(), 2, "the section ends at the next heading");
    assert_eq!(
        violations(dir.path(), &allowed),
        vec!["space/mod.rs: space -> engine".to_string()]
    );
    assert!(allowed_from_doc("- `a`: b\n").is_err());
}

/// A cycle in a directed graph, as `a -> b -> a`, if there is one (depth-first, nodes and
/// edges in sorted order, so the cycle reported is always the same).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<String> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<String> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n.to_owned());
            return Some(cycle.join(" -> "));
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_owned());
        for next in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, graph, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut done, &mut Vec::new()))
}

#[test]
fn the_allowed_table_has_no_cycle() {
    let doc = fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let allowed = allowed_from_doc(&doc).unwrap();
    assert_eq!(
        find_cycle(&allowed),
        None,
        "ARCHITECTURE.md's table has a cycle"
    );
}

/// A file's module path under `src/` (`tune/study/search.rs`: `tune::study::search`;
/// `tune/opt/mod.rs`: `tune::opt`). `None` for the crate roots.
fn module_path(rel: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?.trim_end_matches(".rs").to_owned();
    if parts.is_empty() && (last == "lib" || last == "main") {
        return None;
    }
    if last != "mod" {
        parts.push(last);
    }
    Some(parts)
}

/// Every module path a file's code names, absolute: `crate::a::b` as it is, `super::…` chains
/// climbed from the file's own module `at`, groups (`super::{a, b::{c, d}}`) expanded.
fn named_paths(code: &str, at: &[String]) -> Vec<Vec<String>> {
    fn ident(s: &str) -> &str {
        let end = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        &s[..end]
    }
    /// The paths a `use` tail spells (`a::b::{c, d::e}` → `a::b::c`, `a::b::d::e`).
    fn tails(rest: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut start) = (0usize, 0usize);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        tails(group[start..i].trim(), prefix.clone(), out);
                        return;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        tails(group[start..i].trim(), prefix.clone(), out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let mut path = prefix;
        let mut rest = rest;
        loop {
            let name = ident(rest);
            if name.is_empty() {
                break;
            }
            path.push(name.to_owned());
            rest = &rest[name.len()..];
            match rest.strip_prefix("::") {
                Some(r) if r.starts_with('{') => return tails(r, path, out),
                Some(r) => rest = r,
                None => break,
            }
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    // A path starts where no identifier, `$` (`$crate`) or `::` (the second `super` of a
    // chain) comes before it.
    let starts = |i: usize| {
        !code[..i]
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == ':')
    };
    for (i, _) in code.match_indices("crate::").filter(|(i, _)| starts(*i)) {
        tails(&code[i + "crate::".len()..], Vec::new(), &mut out);
    }
    for (i, _) in code.match_indices("super::").filter(|(i, _)| starts(*i)) {
        let mut after = &code[i..];
        let mut climbs = 0;
        while let Some(a) = after.strip_prefix("super::") {
            climbs += 1;
            after = a;
        }
        if climbs <= at.len() {
            tails(after, at[..at.len() - climbs].to_vec(), &mut out);
        }
    }
    out
}

/// Whether a file is a unit-test module (`tests.rs`, or under a `tests/` directory): tests
/// may use anything.
fn is_test_file(rel: &Path) -> bool {
    rel.iter().any(|p| p == "tests" || p == "tests.rs")
}

/// Each module's dependencies between its own child modules (its files and sub-directories),
/// from every path a file names: `parent -> (child -> children it uses)`. A file in child `a`
/// of module `m` that names `m::b`, where `b` is another child of `m`, is the edge `a -> b`.
fn sibling_edges(src: &Path) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut modules: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut parsed = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(src).expect("under src");
        let Some(m) = module_path(rel) else { continue };
        for k in 1..=m.len() {
            modules.insert(m[..k].to_vec());
        }
        if !is_test_file(rel) {
            parsed.push((m, code_of(&fs::read_to_string(f).expect("readable source"))));
        }
    }
    let mut edges: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (at, code) in &parsed {
        for named in named_paths(code, at) {
            let common = at.iter().zip(&named).take_while(|(a, b)| a == b).count();
            if common < at.len() && common < named.len() && modules.contains(&named[..=common]) {
                edges
                    .entry(at[..common].join("::"))
                    .or_default()
                    .entry(at[common].clone())
                    .or_default()
                    .insert(named[common].clone());
            }
        }
    }
    edges
}

#[test]
fn no_module_has_files_that_depend_on_one_another_in_a_cycle() {
    let cycles: Vec<String> = sibling_edges(&root().join("src"))
        .iter()
        .filter_map(|(parent, graph)| {
            find_cycle(graph).map(|c| {
                format!(
                    "in `{}`: {c}",
                    if parent.is_empty() { "crate" } else { parent }
                )
            })
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "file-level cycles:\n{}",
        cycles.join("\n")
    );
}

/// The cycle checks themselves: a cycle in a table, and a two-file cycle inside a module
/// spelled with `super::` on one side and a `crate::` group on the other, are found; a file
/// using its parent's own items and a test file are not edges.
#[test]
fn the_cycle_checks_find_a_table_cycle_and_a_file_cycle() {
    let allowed = allowed_from_doc(
        "x\n## Dependency directions\n- `a`: `b`\n- `b`: `c`\n- `c`: `a`\n- `d`: nothing\n",
    )
    .unwrap();
    assert_eq!(find_cycle(&allowed).as_deref(), Some("a -> b -> c -> a"));
    let acyclic =
        allowed_from_doc("x\n## Dependency directions\n- `a`: `b`\n- `b`: nothing\n").unwrap();
    assert_eq!(find_cycle(&acyclic), None);

    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("tune");
    fs::create_dir_all(m.join("opt")).unwrap();
    fs::write(
        m.join("mod.rs"),
        "pub mod records;\npub mod decide;\npub mod opt;\n",
    )
    .unwrap();
    fs::write(
        m.join("records.rs"),
        "use super::decide::Check;\nuse super::Shared;\n",
    )
    .unwrap();
    fs::write(
        m.join("decide.rs"),
        "use crate::{space::X, tune::{records::TrialRecord}};\n",
    )
    .unwrap();
    fs::write(m.join("opt/mod.rs"), "use super::decide::Rules;\n").unwrap();
    fs::write(m.join("opt/gp.rs"), "use super::super::records::A;\n").unwrap();
    fs::write(m.join("opt/tests.rs"), "use crate::tune::spec::B;\n").unwrap();
    let edges = sibling_edges(dir.path());
    let tune = &edges["tune"];
    assert_eq!(tune["records"], BTreeSet::from(["decide".to_string()]));
    assert_eq!(tune["decide"], BTreeSet::from(["records".to_string()]));
    assert_eq!(
        tune["opt"],
        BTreeSet::from(["decide".to_string(), "records".to_string()])
    );
    assert_eq!(
        find_cycle(tune).as_deref(),
        Some("decide -> records -> decide")
    );
}

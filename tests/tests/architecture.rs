//! ARCHITECTURE.md's map, checked against the sources of every crate of
//! the workspace (the binaries included):
//! - no module of a crate imports one that imports it back, directly or
//!   through others;
//! - acemq-core's API reaches the protocol machine and the transports only
//!   through `amqp`, and the machine imports nothing above it;
//! - ARCHITECTURE.md names every module's file, in its crate's section.
//!
//! How: every source file is parsed with `syn` (the real Rust grammar, so a
//! path inside an expression, a type, a pattern or a macro's arguments
//! counts as much as a `use`), every path is resolved to the module that
//! defines its item (through `use`, `pub use` re-exports and glob imports),
//! and each reference from module A to module B becomes an edge between
//! the two children of their closest common ancestor that hold A and B.
//! So `amqp::driver -> amqp::line -> amqp::driver` is a circle between
//! siblings, and `amqp::driver -> recovery` with `recovery -> amqp` is one
//! between the top-level modules `amqp` and `recovery`. A module's use of
//! its own ancestors or descendants is what nesting is for and is not
//! counted. Inline modules (`mod tests { ... }`) count as part of their
//! file's module.
//!
//! Test-only code (`#[cfg(test)]` items and modules) is left out: unit
//! tests sit above every layer.
//!
//! Why a test over the sources rather than a tool: it runs wherever `cargo
//! test` runs, needs nothing installed, and parses what the compiler
//! parses; `cargo-modules` would do the same through rust-analyzer at the
//! cost of a large build and a second toolchain to keep in step.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

type ModPath = Vec<String>;

#[derive(Default)]
struct Module {
    /// Written inside its parent's file (`mod x { ... }`).
    inline: bool,
    /// Its file, for a module with one.
    file: Option<PathBuf>,
    /// Names defined here: items and child modules.
    items: BTreeSet<String>,
    children: BTreeSet<String>,
    /// `use` imports: name -> the path it stands for (as written).
    imports: HashMap<String, Vec<String>>,
    /// `use path::*`.
    globs: Vec<Vec<String>>,
    /// Every path written in the module.
    paths: Vec<Vec<String>>,
}

struct Crate {
    modules: BTreeMap<ModPath, Module>,
}

/// What one file says, before paths are resolved.
struct Collector<'a> {
    modules: &'a mut BTreeMap<ModPath, Module>,
    /// The module being read (an inline one inside the file's, at times).
    path: ModPath,
    /// Non-inline `mod x;` declarations: name and `#[path]`.
    file_mods: Vec<(String, Option<String>)>,
    /// The depth of the file's own module.
    file_depth: usize,
}

fn use_tree(tree: &syn::UseTree, prefix: &mut Vec<String>, module: &mut Module) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_tree(&p.tree, prefix, module);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut full = prefix.clone();
            let name = n.ident.to_string();
            if name == "self" {
                if let Some(last) = prefix.last() {
                    module.imports.insert(last.clone(), full.clone());
                }
            } else {
                full.push(name.clone());
                module.imports.insert(name, full.clone());
            }
            module.paths.push(full);
        }
        syn::UseTree::Rename(r) => {
            let mut full = prefix.clone();
            if r.ident != "self" {
                full.push(r.ident.to_string());
            }
            module.imports.insert(r.rename.to_string(), full.clone());
            module.paths.push(full);
        }
        syn::UseTree::Glob(_) => {
            module.globs.push(prefix.clone());
            module.paths.push(prefix.clone());
        }
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_tree(t, prefix, module);
            }
        }
    }
}

/// An item under `#[cfg(test)]`: unit tests sit on top of every layer, so
/// what they import is no part of the crate's structure.
fn test_only(item: &syn::Item) -> bool {
    let attrs = match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => return false,
    };
    attrs
        .iter()
        .any(|a| a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|id| id == "test"))
}

/// Paths inside a macro's tokens: runs of `ident :: ident ...`.
fn macro_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            TokenTree::Group(g) => {
                macro_paths(g.stream(), out);
                i += 1;
            }
            TokenTree::Ident(id) => {
                let mut path = vec![id.to_string()];
                let mut j = i + 1;
                while j + 2 < trees.len() + 1 {
                    let colons = matches!((&trees.get(j), &trees.get(j + 1)),
                        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == ':' && b.as_char() == ':');
                    match (colons, trees.get(j + 2)) {
                        (true, Some(TokenTree::Ident(next))) => {
                            path.push(next.to_string());
                            j += 3;
                        }
                        _ => break,
                    }
                }
                if path.len() > 1 {
                    out.push(path);
                }
                i = j;
            }
            _ => i += 1,
        }
    }
}

impl Collector<'_> {
    fn module(&mut self) -> &mut Module {
        self.modules
            .get_mut(&self.path)
            .expect("the module being read is registered")
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if test_only(item) {
            return;
        }
        let name = match item {
            syn::Item::Const(i) => Some(&i.ident),
            syn::Item::Enum(i) => Some(&i.ident),
            syn::Item::Fn(i) => Some(&i.sig.ident),
            syn::Item::Static(i) => Some(&i.ident),
            syn::Item::Struct(i) => Some(&i.ident),
            syn::Item::Trait(i) => Some(&i.ident),
            syn::Item::Type(i) => Some(&i.ident),
            syn::Item::Union(i) => Some(&i.ident),
            syn::Item::Macro(i) => i.ident.as_ref(),
            _ => None,
        };
        if let Some(name) = name {
            self.module().items.insert(name.to_string());
        }
        match item {
            syn::Item::Use(u) => use_tree(&u.tree, &mut Vec::new(), self.module()),
            syn::Item::Mod(m) if m.content.is_some() => {
                let name = m.ident.to_string();
                self.module().children.insert(name.clone());
                self.path.push(name);
                self.modules.insert(
                    self.path.clone(),
                    Module {
                        inline: true,
                        ..Module::default()
                    },
                );
                for item in &m.content.as_ref().unwrap().1 {
                    self.visit_item(item);
                }
                self.path.pop();
            }
            syn::Item::Mod(m) if m.content.is_none() => {
                let path = m
                    .attrs
                    .iter()
                    .find(|a| a.path().is_ident("path"))
                    .and_then(|a| match &a.meta {
                        syn::Meta::NameValue(nv) => match &nv.value {
                            syn::Expr::Lit(syn::ExprLit {
                                lit: syn::Lit::Str(s), ..
                            }) => Some(s.value()),
                            _ => None,
                        },
                        _ => None,
                    });
                if self.path.len() != self.file_depth {
                    panic!(
                        "a file module declared inside an inline module is not supported: {}",
                        m.ident
                    );
                }
                self.file_mods.push((m.ident.to_string(), path));
            }
            _ => syn::visit::visit_item(self, item),
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 || path.leading_colon.is_none() {
            self.module().paths.push(segments);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let mut found = Vec::new();
        macro_paths(mac.tokens.clone(), &mut found);
        self.module().paths.extend(found);
        syn::visit::visit_macro(self, mac);
    }

    fn visit_item_use(&mut self, _: &'ast syn::ItemUse) {}
}

/// Reads the crate rooted at `root` (a lib.rs or main.rs).
fn read_crate(root: &Path) -> Crate {
    let mut modules = BTreeMap::new();
    read_module(root, Vec::new(), true, &mut modules);
    Crate { modules }
}

fn read_module(file: &Path, path: ModPath, owns_dir: bool, modules: &mut BTreeMap<ModPath, Module>) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    modules.insert(
        path.clone(),
        Module {
            file: Some(file.to_path_buf()),
            ..Module::default()
        },
    );
    let mut collector = Collector {
        modules,
        path: path.clone(),
        file_mods: Vec::new(),
        file_depth: path.len(),
    };
    collector.visit_file(&ast);
    let file_mods = collector.file_mods;
    // A child's file is beside a mod.rs/lib.rs/main.rs, under a folder named
    // after the module otherwise.
    let dir: PathBuf = if owns_dir {
        file.parent().unwrap().to_path_buf()
    } else {
        file.with_extension("")
    };
    for (name, explicit) in &file_mods {
        modules.get_mut(&path).unwrap().children.insert(name.clone());
        let child_file = match explicit {
            Some(p) => file.parent().unwrap().join(p),
            None => {
                let flat = dir.join(format!("{name}.rs"));
                if flat.exists() {
                    flat
                } else {
                    dir.join(name).join("mod.rs")
                }
            }
        };
        let owns = explicit.is_none() && child_file.ends_with("mod.rs");
        let mut child_path = path.clone();
        child_path.push(name.clone());
        read_module(&child_file, child_path, owns, modules);
    }
}

impl Crate {
    /// The absolute form of `path` as written in `module`, if it names
    /// something of this crate.
    fn absolute(&self, module: &ModPath, path: &[String], depth: usize) -> Option<Vec<String>> {
        if depth > 16 || path.is_empty() {
            return None;
        }
        let m = &self.modules[module];
        let first = path[0].as_str();
        let mut base: Vec<String>;
        let rest: &[String];
        match first {
            "crate" => {
                base = Vec::new();
                rest = &path[1..];
            }
            "self" => {
                base = module.clone();
                rest = &path[1..];
            }
            "super" => {
                base = module.clone();
                let mut i = 0;
                while i < path.len() && path[i] == "super" {
                    base.pop()?;
                    i += 1;
                }
                rest = &path[i..];
            }
            _ => {
                if let Some(target) = m.imports.get(first) {
                    // An import of the module itself (`use a::b; b::c`).
                    if target.as_slice() != path {
                        let mut full = target.clone();
                        full.extend_from_slice(&path[1..]);
                        return self.absolute(module, &full, depth + 1);
                    }
                }
                if m.children.contains(first) || m.items.contains(first) {
                    base = module.clone();
                    rest = path;
                } else {
                    return None;
                }
            }
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The module that defines the item `abs` names (or the module itself).
    fn defining(&self, abs: &[String], depth: usize) -> Option<ModPath> {
        if depth > 16 {
            return None;
        }
        let mut current: ModPath = Vec::new();
        for (i, seg) in abs.iter().enumerate() {
            let m = self.modules.get(&current)?;
            if m.children.contains(seg) {
                current.push(seg.clone());
                continue;
            }
            if m.items.contains(seg) {
                return Some(current);
            }
            if let Some(target) = m.imports.get(seg) {
                let mut full = self.absolute(&current, target, depth + 1)?;
                full.extend_from_slice(&abs[i + 1..]);
                return self.defining(&full, depth + 1).or(Some(current));
            }
            for glob in &m.globs {
                let Some(target) = self.absolute(&current, glob, depth + 1) else {
                    continue;
                };
                let Some(source) = self.defining(&target, depth + 1) else {
                    continue;
                };
                let has = self
                    .modules
                    .get(&source)
                    .is_some_and(|g| g.items.contains(seg) || g.children.contains(seg) || g.imports.contains_key(seg));
                if has && source == target {
                    let mut full = target;
                    full.extend_from_slice(&abs[i..]);
                    if let Some(found) = self.defining(&full, depth + 1) {
                        return Some(found);
                    }
                }
            }
            return Some(current);
        }
        Some(current)
    }

    /// The module whose file `module` is written in.
    fn file_of(&self, module: &ModPath) -> ModPath {
        let mut m = module.clone();
        while self.modules.get(&m).is_some_and(|x| x.inline) {
            m.pop();
        }
        m
    }

    /// Edges between siblings, lifted as the module docs say.
    fn edges(&self) -> BTreeMap<ModPath, BTreeMap<(String, String), String>> {
        let mut edges: BTreeMap<ModPath, BTreeMap<(String, String), String>> = BTreeMap::new();
        for (written_in, module) in &self.modules {
            for path in &module.paths {
                let Some(abs) = self.absolute(written_in, path, 0) else {
                    continue;
                };
                let Some(to) = self.defining(&abs, 0) else { continue };
                let (from, to) = (self.file_of(written_in), self.file_of(&to));
                let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
                if common == from.len() || common == to.len() {
                    continue;
                }
                // One example per edge, to say where the circle is made.
                edges
                    .entry(from[..common].to_vec())
                    .or_default()
                    .entry((from[common].clone(), to[common].clone()))
                    .or_insert_with(|| format!("{}: {}", display(written_in), path.join("::")));
            }
        }
        edges
    }

    /// Every circle, each as the modules on it in order, named in full.
    fn circles(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (parent, pairs) in self.edges() {
            let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for (a, b) in pairs.keys() {
                graph.entry(a).or_default().push(b);
            }
            for component in strongly_connected(&graph) {
                if component.len() > 1 {
                    let name = |m: &str| {
                        let mut p = parent.clone();
                        p.push(m.to_string());
                        p.join("::")
                    };
                    let members: Vec<String> = component.iter().map(|m| name(m)).collect();
                    let inside: Vec<String> = pairs
                        .iter()
                        .filter(|((a, b), _)| component.contains(&a.as_str()) && component.contains(&b.as_str()))
                        .map(|((a, b), why)| format!("\n    {} -> {} ({why})", name(a), name(b)))
                        .collect();
                    found.push(format!("{{{}}}:{}", members.join(", "), inside.concat()));
                }
            }
        }
        found
    }
}

fn display(module: &ModPath) -> String {
    if module.is_empty() {
        "crate".to_string()
    } else {
        module.join("::")
    }
}

/// Tarjan's strongly connected components.
fn strongly_connected<'a>(graph: &BTreeMap<&'a str, Vec<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(v: &'a str, graph: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in graph.get(v).map(Vec::as_slice).unwrap_or(&[]) {
            if !s.index.contains_key(w) {
                visit(w, graph, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }
    let mut s = State {
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(v, graph, &mut s);
        }
    }
    s.out
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The workspace's packages, by folder (acemq-cli lives inside acemq-core's).
const PACKAGES: [&str; 5] = ["amqp-codec", "acemq-core", "acemq-core/cli", "acemq-memory", "tests"];

/// Every crate root of the workspace: each package's lib and binaries.
fn crate_roots() -> Vec<PathBuf> {
    let ws = workspace();
    let mut roots = Vec::new();
    for package in PACKAGES {
        let src = ws.join(package).join("src");
        if src.join("lib.rs").exists() {
            roots.push(src.join("lib.rs"));
        }
        if src.join("main.rs").exists() {
            roots.push(src.join("main.rs"));
        }
        let bin = src.join("bin");
        if let Ok(entries) = std::fs::read_dir(&bin) {
            for entry in entries.flatten() {
                let p = entry.path();
                if p.extension().is_some_and(|e| e == "rs") {
                    roots.push(p);
                } else if p.join("main.rs").exists() {
                    roots.push(p.join("main.rs"));
                }
            }
        }
    }
    roots.sort();
    roots
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let mut report = Vec::new();
    for root in crate_roots() {
        let krate = read_crate(&root);
        for circle in krate.circles() {
            report.push(format!(
                "{}: {circle}",
                root.strip_prefix(workspace()).unwrap().display()
            ));
        }
    }
    assert!(
        report.is_empty(),
        "import circles between modules:\n{}",
        report.join("\n")
    );
}

/// The check itself: a crate written to hold circles has them found, one
/// without has none, and what nesting allows is not counted.
#[test]
fn the_check_finds_circles_between_siblings_and_between_layers() {
    let dir = std::env::temp_dir().join(format!("acemq-module-circles-{}", std::process::id()));
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    // a -> b -> a through a re-export and a macro; net::x -> api (a layer
    // circle between `net` and `api`); child -> parent is allowed.
    write("circles/lib.rs", "mod a; mod b; mod api; mod net; pub use b::Thing;\n");
    write("circles/a.rs", "pub struct A; fn f() { let _ = crate::Thing; }\n");
    write(
        "circles/b.rs",
        "pub struct Thing; fn g() { println!(\"{:?}\", super::a::A); }\n",
    );
    write("circles/api.rs", "use crate::net::Socket; pub struct Handle;\n");
    write("circles/net/mod.rs", "mod x; pub use x::Socket;\n");
    write(
        "circles/net/x.rs",
        "pub struct Socket(crate::api::Handle); fn h() { let _ = super::Socket; }\n",
    );
    let found = read_crate(&dir.join("circles/lib.rs")).circles();
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found.iter().any(|c| c.starts_with("{a, b}:")), "{found:#?}");
    assert!(found.iter().any(|c| c.starts_with("{api, net}:")), "{found:#?}");

    write("layered/lib.rs", "mod a; mod b; pub mod c; pub use c::*;\n");
    write("layered/a.rs", "use crate::b::B; pub struct A(B, crate::C);\n");
    write(
        "layered/b.rs",
        "pub struct B; fn f() -> super::C { super::C }\nmod inner { fn g() -> super::B { super::B } fn h() -> Missing {} }\n",
    );
    write("layered/c/mod.rs", "mod d; pub use d::C;\n");
    write("layered/c/d.rs", "pub struct C; fn f() -> super::super::c::C { C }\n");
    let found = read_crate(&dir.join("layered/lib.rs")).circles();
    assert!(found.is_empty(), "{found:#?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The package folder of a crate root, and the root's path inside `src/`.
fn package_of(root: &Path) -> (String, PathBuf) {
    let rel = root.strip_prefix(workspace()).unwrap();
    // The package whose src/ holds the root (the longest such folder).
    let package = PACKAGES
        .iter()
        .filter(|p| rel.starts_with(Path::new(p).join("src")))
        .max_by_key(|p| p.len())
        .unwrap_or_else(|| panic!("{} is in no package's src/", rel.display()))
        .to_string();
    (package.clone(), workspace().join(package).join("src"))
}

/// The text of ARCHITECTURE.md's section for a package: from the `###`
/// heading that names the package's folder (`` `acemq-core/src/` ``) to
/// the next heading.
fn section<'a>(doc: &'a str, package: &str) -> &'a str {
    let heading = format!("`{package}/src/`");
    let start = doc
        .lines()
        .scan(0, |at, line| {
            let here = *at;
            *at += line.len() + 1;
            Some((here, line))
        })
        .find(|(_, line)| line.starts_with("### ") && line.contains(&heading))
        .map(|(at, _)| at)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no `### ...` heading naming {heading}"));
    let rest = &doc[start..];
    let end = rest[4..].find("\n#").map(|i| i + 5).unwrap_or(rest.len());
    &rest[..end]
}

#[test]
fn architecture_md_names_every_module() {
    let doc = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    for root in crate_roots() {
        let (package, src) = package_of(&root);
        let text = section(&doc, &package);
        for module in read_crate(&root).modules.values() {
            let Some(file) = &module.file else { continue };
            let file = file.canonicalize().unwrap();
            // A file included from outside the crate's src/ (`#[path]`) is
            // named by its path in the workspace, anywhere in the file.
            let (rel, named) = match file.strip_prefix(src.canonicalize().unwrap()) {
                Ok(rel) => {
                    let rel = rel.to_string_lossy().into_owned();
                    let named = text.contains(&format!("`{rel}`"));
                    (format!("{package}/src/{rel}"), named)
                }
                Err(_) => {
                    let rel = file.strip_prefix(workspace().canonicalize().unwrap()).unwrap();
                    let rel = rel.to_string_lossy().into_owned();
                    let named = doc.contains(&format!("`{rel}`"));
                    (rel, named)
                }
            };
            if !named {
                missing.push(rel);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name these modules in their crate's section (as `path/in/src.rs`):\n{}",
        missing.join("\n")
    );
}

/// What each of acemq-core's layers may name of the crate, as written (a
/// type re-exported by `amqp` is reached through `amqp`).
#[test]
fn the_acemq_api_reaches_the_machine_only_through_amqp() {
    let root = workspace().join("acemq-core/src/lib.rs");
    let krate = read_crate(&root);
    // Leaves everything may use: they import nothing of the crate but
    // each other.
    let leaves = ["text", "time", "metrics_names"];
    let mut wrong = Vec::new();
    for (path, module) in &krate.modules {
        let layer = path.first().map(String::as_str).unwrap_or("");
        let allowed: &[&str] = match layer {
            // The machine: itself and the leaves.
            "proto" => &["proto"],
            // Transports: themselves.
            "io" => &["io"],
            // The engine: itself, the machine, the transports.
            "amqp" => &["amqp", "proto", "io"],
            "text" | "time" | "metrics_names" => &["text", "time", "metrics_names"],
            // The fuzz harness drives whatever it fuzzes.
            "fuzzing" | "" => continue,
            // The acemq API: anything but the machine and the transports.
            _ => &[],
        };
        for written in &module.paths {
            let Some(abs) = krate.absolute(path, written, 0) else {
                continue;
            };
            let Some(first) = abs.first().map(String::as_str) else {
                continue;
            };
            if first == layer || leaves.contains(&first) || !krate.modules.contains_key(&vec![first.to_string()]) {
                continue;
            }
            let ok = if allowed.is_empty() {
                first != "proto" && first != "io"
            } else {
                allowed.contains(&first)
            };
            if !ok {
                wrong.push(format!("{}: {}", display(path), written.join("::")));
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "paths across acemq-core's layers:\n{}",
        wrong.join("\n")
    );
}

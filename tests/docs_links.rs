//! Every relative link and every `#anchor` of the documentation resolves, as GitHub renders
//! it: README.md, BENCHMARKS.md and every page of docs/ (no network: links with a scheme,
//! `https://…`, are not followed). A link names a file or folder of the repository, and its
//! anchor a heading of the Markdown file it points into, spelled by GitHub's rule: the
//! heading's text lower-cased, punctuation dropped (letters, digits, `-`, `_` and spaces
//! kept), each space turned into `-`, and a repeated heading suffixed `-1`, `-2`, …
//!
//! The checker's own tests show it fails: a missing file, a missing anchor, a duplicate
//! heading's second anchor, links inside code that must not count.
//!
//! The alerts' runbooks are checked too: each `Runbook: docs/operating.md, Alerts, <alert>`
//! of the chart's rule file names a heading `Alert: <alert>` of that page.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

/// A link that does not resolve: where it is, what it says, why.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Broken {
    file: String,
    line: usize,
    target: String,
    why: String,
}

/// The anchors GitHub gives the headings of a Markdown text, in order.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (line, in_code) in lines_outside_code(text) {
        if in_code {
            continue;
        }
        let Some(title) = heading(line) else {
            // Explicit anchors (`<a id="x">`, `<a name="x">`) are targets as well.
            out.extend(html_anchors(line));
            continue;
        };
        let slug = slug(title);
        let n = seen.entry(slug.clone()).or_insert(0);
        out.push(if *n == 0 { slug } else { format!("{slug}-{n}") });
        *n += 1;
    }
    out
}

/// The text of an ATX heading (`## Title ##`), if the line is one.
fn heading(line: &str) -> Option<&str> {
    let trimmed = line
        .strip_prefix("   ")
        .or(line.strip_prefix("  "))
        .or(line.strip_prefix(' '))
        .unwrap_or(line);
    let hashes = trimmed.bytes().take_while(|&b| b == b'#').count();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let rest = &trimmed[hashes..];
    if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
        return None;
    }
    let rest = rest.trim();
    // A closing run of `#` preceded by a space is not part of the title.
    let rest = match rest.trim_end_matches('#') {
        r if r.len() < rest.len() && (r.is_empty() || r.ends_with(' ')) => r.trim_end(),
        _ => rest,
    };
    Some(rest)
}

/// GitHub's anchor for a heading's text.
fn slug(title: &str) -> String {
    // Links and images render as their text; other markup is punctuation and drops.
    let text = replace_links_by_text(title);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// `[text](target)` and `![alt](target)` replaced by their text.
fn replace_links_by_text(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|i| open + i) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|i| close + i) else {
            break;
        };
        out.push_str(rest[..open].trim_end_matches('!'));
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// `id`/`name` values of `<a …>` tags on a line.
fn html_anchors(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("<a ") {
        let tag_end = rest[i..].find('>').map_or(rest.len(), |e| i + e);
        let tag = &rest[i..tag_end];
        for attr in ["id=\"", "name=\""] {
            if let Some(a) = tag.find(attr) {
                let v = &tag[a + attr.len()..];
                if let Some(q) = v.find('"') {
                    out.push(v[..q].to_string());
                }
            }
        }
        rest = &rest[tag_end..];
    }
    out
}

/// Each line with whether it is inside a fenced code block (the fences count as inside).
fn lines_outside_code(text: &str) -> Vec<(&str, bool)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| t.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                out.push((line, true));
            }
            (Some(f), Some(m))
                if f == m && t.trim_end().chars().all(|c| c == m.as_bytes()[0] as char) =>
            {
                fence = None;
                out.push((line, true));
            }
            _ => out.push((line, fence.is_some())),
        }
    }
    out
}

/// The text of a line with its inline code spans removed (a link in code is not a link).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(open) = rest.find('`') {
        let ticks = rest[open..].bytes().take_while(|&b| b == b'`').count();
        let delim = &rest[open..open + ticks];
        let after = &rest[open + ticks..];
        match after.find(delim) {
            Some(close) => {
                out.push_str(&rest[..open]);
                rest = &after[close + ticks..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    out
}

/// The link targets of a line: `](target)` of inline links and images, and `[ref]: target`
/// definitions.
fn targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let inner = after[..end].trim();
        let target = match inner.strip_prefix('<') {
            Some(t) => t.split('>').next().unwrap_or(""),
            None => inner.split_whitespace().next().unwrap_or(""),
        };
        out.push(target.to_string());
        rest = &after[end..];
    }
    let t = line.trim_start();
    if t.starts_with('[') && !t.starts_with("[!") {
        if let Some(close) = t.find("]:") {
            if let Some(target) = t[close + 2..].split_whitespace().next() {
                out.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
            }
        }
    }
    out
}

/// True for `https:`, `mailto:` and the like: not a file of the repository.
fn has_scheme(target: &str) -> bool {
    match target.find(':') {
        Some(i) => {
            let scheme = &target[..i];
            !scheme.is_empty()
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }
        None => false,
    }
}

/// `%20` and the like decoded (GitHub links to files with spaces so).
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` with `.` and `..` folded, or None when it climbs out of its root.
fn normalized(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Checks the links of `files` (paths relative to `root`): every relative target exists
/// under `root`, and every anchor is one of the target Markdown file's.
fn check(root: &Path, files: &[PathBuf]) -> Vec<Broken> {
    let mut cache: HashMap<PathBuf, Vec<String>> = HashMap::new();
    let mut anchors_of = |rel: &Path| -> Option<Vec<String>> {
        if let Some(a) = cache.get(rel) {
            return Some(a.clone());
        }
        let text = std::fs::read_to_string(root.join(rel)).ok()?;
        let a = anchors(&text);
        cache.insert(rel.to_path_buf(), a.clone());
        Some(a)
    };
    let mut broken = Vec::new();
    for file in files {
        let text = match std::fs::read_to_string(root.join(file)) {
            Ok(t) => t,
            Err(e) => {
                broken.push(Broken {
                    file: file.display().to_string(),
                    line: 0,
                    target: String::new(),
                    why: format!("cannot be read: {e}"),
                });
                continue;
            }
        };
        let dir = file.parent().unwrap_or(Path::new(""));
        for (n, (line, in_code)) in lines_outside_code(&text).into_iter().enumerate() {
            if in_code {
                continue;
            }
            for target in targets(line) {
                let mut fail = |why: String| {
                    broken.push(Broken {
                        file: file.display().to_string(),
                        line: n + 1,
                        target: target.clone(),
                        why,
                    })
                };
                if target.is_empty() {
                    fail("empty link".into());
                    continue;
                }
                if has_scheme(&target) {
                    continue;
                }
                let (path, fragment) = match target.split_once('#') {
                    Some((p, f)) => (p, Some(f)),
                    None => (target.as_str(), None),
                };
                let dest = if path.is_empty() {
                    file.clone()
                } else if path.starts_with('/') {
                    fail(
                        "an absolute path: GitHub resolves it from the site, not the repository"
                            .into(),
                    );
                    continue;
                } else {
                    match normalized(&dir.join(percent_decoded(path))) {
                        Some(p) => p,
                        None => {
                            fail("climbs out of the repository".into());
                            continue;
                        }
                    }
                };
                if !root.join(&dest).exists() {
                    fail(format!("{} does not exist", dest.display()));
                    continue;
                }
                let Some(fragment) = fragment else { continue };
                let is_markdown = dest.extension().is_some_and(|e| e == "md");
                if !is_markdown {
                    // GitHub's line anchors of a source file (`#L10`, `#L10-L20`).
                    let line_anchor = fragment.split('-').all(|p| {
                        p.len() > 1
                            && p.starts_with('L')
                            && p[1..].bytes().all(|b| b.is_ascii_digit())
                    });
                    if !(line_anchor && root.join(&dest).is_file()) {
                        fail(format!(
                            "#{fragment} on {}, which is not a Markdown file",
                            dest.display()
                        ));
                    }
                    continue;
                }
                let known = anchors_of(&dest).unwrap_or_default();
                if !known.iter().any(|a| a == fragment) {
                    fail(format!(
                        "{} has no heading with the anchor #{fragment}",
                        dest.display()
                    ));
                }
            }
        }
    }
    broken
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, BENCHMARKS.md and every Markdown page of docs/.
fn documentation() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("README.md"), PathBuf::from("BENCHMARKS.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| PathBuf::from("docs").join(p.file_name().expect("a file name")))
        .collect();
    pages.sort();
    files.extend(pages);
    files
}

#[test]
fn every_link_and_anchor_of_the_documentation_resolves() {
    let files = documentation();
    assert!(
        files.len() >= 10,
        "the README, BENCHMARKS.md and the pages of docs/: {files:?}"
    );
    // The checker really read links: a documentation with no resolving link is no proof.
    let links: usize = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(repo().join(f)).unwrap();
            lines_outside_code(&text)
                .into_iter()
                .filter(|(_, code)| !code)
                .map(|(l, _)| targets(l).len())
                .sum::<usize>()
        })
        .sum();
    assert!(links >= 100, "only {links} links found in {files:?}");
    let broken = check(&repo(), &files);
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken
            .iter()
            .map(|b| format!("  {}:{}: ({}) {}", b.file, b.line, b.target, b.why))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    // Issue 38: at most about 250 lines; the manual lives in docs/.
    assert!(lines <= 250, "README.md has {lines} lines");
    // .ci/run runs the test command the README names, and the README names the two commands.
    for command in ["cargo run --release", "./scripts/test.sh"] {
        assert!(
            readme.lines().any(|l| l.trim() == command),
            "README.md does not give `{command}` as a command of its own"
        );
    }
    let ci = std::fs::read_to_string(repo().join(".ci/run")).unwrap();
    assert!(
        ci.lines()
            .any(|l| l.trim_start().ends_with("./scripts/test.sh")
                && !l.trim_start().starts_with('#')),
        ".ci/run no longer runs ./scripts/test.sh, the README's test command"
    );
    // Every page of docs/ is reachable from the index.
    let index = std::fs::read_to_string(repo().join("docs/README.md")).unwrap();
    for page in documentation().iter().filter(|p| p.starts_with("docs")) {
        let name = page.file_name().unwrap().to_string_lossy().to_string();
        if name == "README.md" {
            continue;
        }
        assert!(
            index.contains(&format!("]({name})")),
            "docs/README.md does not link {name}"
        );
    }
}

#[test]
fn every_alert_names_a_runbook_on_the_operating_page() {
    let rules =
        std::fs::read_to_string(repo().join("charts/ray-history-collector/files/alerts.yaml"))
            .unwrap();
    let page = std::fs::read_to_string(repo().join("docs/operating.md")).unwrap();
    let page_anchors = anchors(&page);
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::trim)
        .collect();
    assert!(alerts.len() >= 5, "alerts of the rule file: {alerts:?}");
    // The descriptions are folded YAML: join the lines before looking for the runbook.
    let joined = rules.split_whitespace().collect::<Vec<_>>().join(" ");
    for alert in alerts {
        let reference = format!("Runbook: docs/operating.md, Alerts, {alert}.");
        assert!(
            joined.contains(&reference),
            "the rule {alert} does not name its runbook as `{reference}`"
        );
        let anchor = slug(&format!("Alert: {alert}"));
        assert!(
            page_anchors.contains(&anchor),
            "docs/operating.md has no heading `Alert: {alert}` (#{anchor})"
        );
    }
}

// ---- the checker itself, on small inputs: it must fail where GitHub's link would

fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

fn broken_in(files: &[(&str, &str)], check_these: &[&str]) -> Vec<(usize, String)> {
    let dir = tree(files);
    let list: Vec<PathBuf> = check_these.iter().map(PathBuf::from).collect();
    check(dir.path(), &list)
        .into_iter()
        .map(|b| (b.line, b.target))
        .collect()
}

#[test]
fn github_anchors_follow_githubs_rules() {
    let text = "# ray-history-collector\n\
                ## Security: what is exposed where\n\
                ### KubeRay's `ray-cluster` chart\n\
                ## Event keys: snake_case and camelCase\n\
                ## Inspect: reading a dead cluster's history ##\n\
                ## Examples\n\
                ## Examples\n\
                ## Examples\n\
                ## A [linked](https://example.com) title\n\
                ```sh\n\
                # not a heading\n\
                ```\n\
                #not-a-heading\n\
                <a id=\"custom\"></a>\n";
    assert_eq!(
        anchors(text),
        vec![
            "ray-history-collector",
            "security-what-is-exposed-where",
            "kuberays-ray-cluster-chart",
            "event-keys-snake_case-and-camelcase",
            "inspect-reading-a-dead-clusters-history",
            "examples",
            "examples-1",
            "examples-2",
            "a-linked-title",
            "custom",
        ]
    );
    assert_eq!(
        slug("CPU per event at 25,000 events/s: igzip"),
        "cpu-per-event-at-25000-eventss-igzip"
    );
}

#[test]
fn the_checker_fails_on_a_missing_file() {
    let broken = broken_in(
        &[
            (
                "README.md",
                "# Top\n\nSee [the guide](docs/guide.md) and [gone](docs/gone.md).\n",
            ),
            ("docs/guide.md", "# Guide\n"),
        ],
        &["README.md"],
    );
    assert_eq!(broken, vec![(3, "docs/gone.md".to_string())]);
}

#[test]
fn the_checker_fails_on_a_missing_anchor() {
    let broken = broken_in(
        &[
            (
                "README.md",
                "# Top\n\n[ok](#top), [ok](docs/guide.md#the-part), [bad](#nowhere),\n\
                 [bad](docs/guide.md#The-Part), [bad](docs/guide.md#the-part-1)\n",
            ),
            ("docs/guide.md", "# Guide\n\n## The part\n"),
        ],
        &["README.md"],
    );
    assert_eq!(
        broken,
        vec![
            (3, "#nowhere".to_string()),
            (4, "docs/guide.md#The-Part".to_string()),
            (4, "docs/guide.md#the-part-1".to_string()),
        ]
    );
}

#[test]
fn the_checker_resolves_from_the_linking_file_and_stays_in_the_repository() {
    let broken = broken_in(
        &[
            ("README.md", "# Top\n"),
            (
                "docs/a.md",
                "# A\n[up](../README.md#top) [sibling](b.md) [wrong dir](docs/b.md)\n\
                 [out](../../etc/passwd) [abs](/README.md) [web](https://example.com/x#y)\n\
                 [dir](../src) [line](../src/lib.rs#L3) [not md](../src/lib.rs#top)\n",
            ),
            ("docs/b.md", "# B\n"),
            ("src/lib.rs", "//! x\n"),
        ],
        &["docs/a.md"],
    );
    assert_eq!(
        broken,
        vec![
            (2, "docs/b.md".to_string()),
            (3, "../../etc/passwd".to_string()),
            (3, "/README.md".to_string()),
            (4, "../src/lib.rs#top".to_string()),
        ]
    );
}

#[test]
fn links_in_code_are_not_links() {
    let broken = broken_in(
        &[(
            "README.md",
            "# Top\n\n`[x](missing.md)` is code.\n\n```md\n[y](missing.md)\n```\n\n\
             [z](missing.md)\n\n[ref]: gone.md\n",
        )],
        &["README.md"],
    );
    assert_eq!(
        broken,
        vec![(9, "missing.md".to_string()), (11, "gone.md".to_string())]
    );
}

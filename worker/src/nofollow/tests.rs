use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use flate2::Compression;

use super::extract::{extract_tar_gz, ExtractError};
use super::walk::{walk, Step};
use super::*;

fn tar_gz(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    build(&mut b);
    let raw = b.into_inner().unwrap();
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(&raw).unwrap();
    gz.finish().unwrap()
}

fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h
}

/// Writes a raw name into the header, bypassing the builder's own checks.
fn raw_name(h: &mut tar::Header, name: &str) {
    let gnu = h.as_gnu_mut().unwrap();
    gnu.name = [0; 100];
    gnu.name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_cksum();
}

fn file(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8], mode: u32) {
    let mut h = header(tar::EntryType::Regular, data.len() as u64, mode);
    raw_name(&mut h, name);
    b.append(&h, data).unwrap();
}

fn link(b: &mut tar::Builder<Vec<u8>>, name: &str, target: &str) {
    let mut h = header(tar::EntryType::Symlink, 0, 0o777);
    b.append_link(&mut h, name, target).unwrap();
}

fn extract(data: &[u8], limit: u64) -> (tempfile::TempDir, PathBuf, Result<u64, ExtractError>) {
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("dep");
    fs::create_dir(&dest).unwrap();
    let r = extract_tar_gz(data, &Dir::open(&dest).unwrap(), limit);
    (root, dest, r)
}

#[test]
fn links_are_kept_exactly_as_archived() {
    let data = tar_gz(|b| {
        link(b, "broken-symlink", "/broken-symlink");
        link(b, "abs", "/etc/passwd");
        link(b, "up", "../../..");
        link(b, "d/rel", "../f");
        file(b, "f", b"x", 0o644);
    });
    let (_root, dest, r) = extract(&data, 1 << 20);
    r.unwrap();
    for (name, target) in [
        ("broken-symlink", "/broken-symlink"),
        ("abs", "/etc/passwd"),
        ("up", "../../.."),
        ("d/rel", "../f"),
    ] {
        assert_eq!(
            fs::read_link(dest.join(name)).unwrap(),
            PathBuf::from(target)
        );
    }
}

#[test]
fn nothing_is_written_through_a_link() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().to_str().unwrap().to_owned();
    // A link to a host directory, then a file "inside" it; and a chain of links that each look
    // contained but climb out together.
    for (links, victim) in [
        (vec![("out", target.as_str())], "out/planted"),
        (
            vec![("a/b/up", "../.."), ("esc", "a/b/up/../..")],
            "esc/planted",
        ),
    ] {
        let data = tar_gz(|b| {
            for (n, t) in &links {
                link(b, n, t);
            }
            file(b, victim, b"evil", 0o644);
        });
        let (root, _dest, r) = extract(&data, 1 << 20);
        let e = r.unwrap_err();
        assert!(
            matches!(&e, ExtractError::Refused(m) if m.contains("is a link")),
            "{e:?}"
        );
        assert!(!outside.path().join("planted").exists());
        assert!(!root.path().join("planted").exists());
    }
}

#[test]
fn entries_that_leave_are_refused() {
    for name in ["../evil", "/tmp/clw-abs-evil", "a/../../evil"] {
        let data = tar_gz(|b| file(b, name, b"evil", 0o644));
        let (root, _dest, r) = extract(&data, 1 << 20);
        let e = r.unwrap_err();
        assert!(
            matches!(&e, ExtractError::Refused(m) if m.contains("leaves the bundle")),
            "{name}: {e:?}"
        );
        assert!(!root.path().join("evil").exists());
    }
    assert!(!Path::new("/tmp/clw-abs-evil").exists());
    // A hard link to something outside, too.
    let data = tar_gz(|b| {
        let mut h = header(tar::EntryType::Link, 0, 0o644);
        raw_name(&mut h, "h");
        h.set_link_name_literal("../../etc/passwd").unwrap();
        h.set_cksum();
        b.append(&h, &b""[..]).unwrap();
    });
    let (_root, _dest, r) = extract(&data, 1 << 20);
    assert!(matches!(r, Err(ExtractError::Refused(_))), "{r:?}");
}

#[test]
fn hard_links_inside_work_and_do_not_follow_links() {
    let data = tar_gz(|b| {
        file(b, "f", b"data", 0o644);
        let mut h = header(tar::EntryType::Link, 0, 0o644);
        raw_name(&mut h, "g");
        h.set_link_name_literal("f").unwrap();
        h.set_cksum();
        b.append(&h, &b""[..]).unwrap();
    });
    let (_root, dest, r) = extract(&data, 1 << 20);
    r.unwrap();
    assert_eq!(
        fs::metadata(dest.join("f")).unwrap().ino(),
        fs::metadata(dest.join("g")).unwrap().ino()
    );
}

#[test]
fn set_id_bits_are_dropped_and_modes_kept() {
    let data = tar_gz(|b| {
        file(b, "suid", b"#!/bin/sh\n", 0o6755);
        let mut h = header(tar::EntryType::Directory, 0, 0o3755);
        raw_name(&mut h, "sgid-dir/");
        b.append(&h, &b""[..]).unwrap();
        file(b, "ro/f", b"x", 0o444);
        let mut h = header(tar::EntryType::Directory, 0, 0o555);
        raw_name(&mut h, "ro/");
        b.append(&h, &b""[..]).unwrap();
    });
    let (_root, dest, r) = extract(&data, 1 << 20);
    r.unwrap();
    let mode = |p: &str| fs::symlink_metadata(dest.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("suid"), 0o755);
    assert_eq!(mode("sgid-dir"), 0o755);
    assert_eq!(mode("ro"), 0o555);
    assert_eq!(mode("ro/f"), 0o444);
    // And the tree still goes away.
    tree::remove_path(&dest).unwrap();
    assert!(!dest.exists());
}

#[test]
fn owner_only_modes_become_readable_by_every_user() {
    // A run under --run-as-user is not the dependencies' owner: it must still read them.
    let data = tar_gz(|b| {
        file(b, "private", b"x", 0o600);
        file(b, "script", b"#!/bin/sh\n", 0o700);
        let mut h = header(tar::EntryType::Directory, 0, 0o700);
        raw_name(&mut h, "closed/");
        b.append(&h, &b""[..]).unwrap();
    });
    let (_root, dest, r) = extract(&data, 1 << 20);
    r.unwrap();
    let mode = |p: &str| fs::symlink_metadata(dest.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("private"), 0o644);
    assert_eq!(mode("script"), 0o755);
    assert_eq!(mode("closed"), 0o755);
    tree::remove_path(&dest).unwrap();
    assert!(!dest.exists());
}

#[test]
fn contents_past_the_limit_stop_the_extraction() {
    let data = tar_gz(|b| {
        file(b, "a", &[0u8; 600], 0o644);
        file(b, "b", &[0u8; 600], 0o644);
    });
    let (_root, _dest, r) = extract(&data, 1000);
    assert!(matches!(r, Err(ExtractError::TooLarge(_))), "{r:?}");
    let (_root, _dest, r) = extract(&data, 1200);
    assert_eq!(r.unwrap(), 1200);
}

#[test]
fn entries_past_their_cap_stop_the_extraction() {
    // Empty files hold no bytes, but each takes an inode.
    let data = tar_gz(|b| {
        for i in 0..50 {
            file(b, &format!("e{i}"), b"", 0o644);
        }
    });
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("d");
    fs::create_dir(&dest).unwrap();
    let r =
        super::extract::extract_tar_gz_capped(&data[..], &Dir::open(&dest).unwrap(), 1 << 20, 49);
    assert!(
        matches!(&r, Err(ExtractError::Refused(m)) if m.contains("more than 49 entries")),
        "{r:?}"
    );
    let dest2 = root.path().join("d2");
    fs::create_dir(&dest2).unwrap();
    let r =
        super::extract::extract_tar_gz_capped(&data[..], &Dir::open(&dest2).unwrap(), 1 << 20, 50);
    assert_eq!(r.unwrap(), 0);
}

#[test]
fn a_truncated_stream_is_corrupt() {
    let data = tar_gz(|b| file(b, "a", &[7u8; 100_000], 0o644));
    let (_root, _dest, r) = extract(&data[..data.len() / 2], 1 << 20);
    assert!(matches!(r, Err(ExtractError::Corrupt(_))), "{r:?}");
}

/// A chain of `depth` directories named `d`, the last holding a 1000-byte file; made with
/// descriptors, since the path is longer than the kernel takes.
fn deep_tree(root: &Path, depth: usize) {
    let mut cur = Dir::open(root).unwrap();
    for _ in 0..depth {
        cur = cur.create_dir(OsStr::new("d"), 0o755).unwrap();
    }
    let mut f = cur.create_file(OsStr::new("f"), 0o644).unwrap();
    f.write_all(&[1u8; 1000]).unwrap();
}

#[test]
fn trees_deeper_than_path_max_are_measured_archived_and_removed() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("bundle");
    fs::create_dir(&root).unwrap();
    let depth = 3000; // "d/" × 3000 = 6000 bytes of path, past PATH_MAX (4096)
    deep_tree(&root, depth);
    let dir = Dir::open(&root).unwrap();
    let size = tree::size(&dir).unwrap();
    assert!(size >= 1000 + depth as u64, "{size}");
    let mut builder = tar::Builder::new(Vec::new());
    archive::append_tree(&mut builder, &dir, |_| false).unwrap();
    let bytes = builder.into_inner().unwrap();
    let mut names = 0;
    for e in tar::Archive::new(&bytes[..]).entries().unwrap() {
        let mut e = e.unwrap();
        names += 1;
        if e.header().entry_type().is_file() {
            assert_eq!(e.path().unwrap().components().count(), depth + 1);
            // The bytes behind a long name's own entry and the header, padded to 512.
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            assert_eq!(data, [1u8; 1000]);
        }
    }
    assert_eq!(bytes.len() % 512, 0);
    assert_eq!(names, depth + 1);
    tree::remove_path(&root).unwrap();
    assert!(!root.exists());
}

#[test]
fn walks_never_follow_links() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("b");
    fs::create_dir_all(root.join("sub")).unwrap();
    fs::write(root.join("sub/f"), vec![0u8; 5000]).unwrap();
    symlink("/usr", root.join("usr")).unwrap();
    symlink("..", root.join("sub/up")).unwrap();
    symlink("loop", root.join("loop")).unwrap();
    let mut seen = Vec::new();
    walk(&Dir::open(&root).unwrap(), |e| {
        seen.push(e.rel.to_owned());
        Ok(Step::Descend)
    })
    .unwrap();
    seen.sort();
    assert_eq!(
        seen,
        ["loop", "sub", "sub/f", "sub/up", "usr"].map(PathBuf::from)
    );
    let n = tree::size(&Dir::open(&root).unwrap()).unwrap();
    assert!(n < 5000 + 4 * 4096 + 100, "{n}");
    // Removing the tree removes the links, not what they name.
    tree::remove_path(&root).unwrap();
    assert!(Path::new("/usr/bin").exists());
}

#[test]
fn a_directory_moved_during_a_walk_ends_it() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("b");
    fs::create_dir_all(root.join("a/b")).unwrap();
    fs::write(root.join("a/b/f"), "x").unwrap();
    let r = walk(&Dir::open(&root).unwrap(), |e| {
        if e.rel == Path::new("a/b/f") {
            // As a running container could: the directory being walked moves up a level.
            fs::rename(root.join("a/b"), root.join("moved")).unwrap();
        }
        Ok(Step::Descend)
    });
    let e = r.unwrap_err();
    assert!(e.to_string().contains("changed"), "{e}");
}

#[test]
fn dirs_are_created_and_opened_without_following_links() {
    let t = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let root = t.path().join("b");
    fs::create_dir(&root).unwrap();
    symlink(outside.path(), root.join("planted")).unwrap();
    let dir = Dir::open(&root).unwrap();
    let e = dir.create_dirs(Path::new("planted/x"), 0o755).unwrap_err();
    assert!(e.to_string().contains("planted is a link"), "{e}");
    let e = dir.beneath(Path::new("planted")).unwrap_err();
    assert!(e.to_string().contains("is a link"), "{e}");
    assert!(dir.beneath(Path::new("../x")).is_err());
    assert!(fs::read_dir(outside.path()).unwrap().next().is_none());
    // A link at a name a file or a link is made at is replaced, not written through.
    fs::write(outside.path().join("victim"), "keep").unwrap();
    symlink(outside.path().join("victim"), root.join("f")).unwrap();
    dir.create_file(OsStr::new("f"), 0o644)
        .unwrap()
        .write_all(b"new")
        .unwrap();
    dir.symlink(OsStr::new("/x"), OsStr::new("planted"))
        .unwrap();
    assert_eq!(
        fs::read_to_string(outside.path().join("victim")).unwrap(),
        "keep"
    );
    assert_eq!(fs::read_to_string(root.join("f")).unwrap(), "new");
    assert_eq!(
        fs::read_link(root.join("planted")).unwrap(),
        PathBuf::from("/x")
    );
    // The root itself must not be a link.
    symlink(&root, t.path().join("alias")).unwrap();
    assert!(Dir::open(&t.path().join("alias")).is_err());
}

#[test]
fn unreadable_directories_are_removed_by_their_owner() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("b");
    fs::create_dir_all(root.join("locked/inner")).unwrap();
    fs::write(root.join("locked/inner/f"), "x").unwrap();
    fs::set_permissions(root.join("locked/inner"), fs::Permissions::from_mode(0o000)).unwrap();
    fs::set_permissions(root.join("locked"), fs::Permissions::from_mode(0o000)).unwrap();
    tree::remove_path(&root).unwrap();
    assert!(!root.exists());
}

#[test]
fn a_files_bytes_go_in_as_the_tar_crate_writes_them() {
    let t = tempfile::tempdir().unwrap();
    let long = "n".repeat(150);
    let files: [(&str, usize); 4] = [("a", 700), ("b", 512), ("e", 0), (&long, 1)];
    for (name, len) in files {
        fs::write(t.path().join(name), vec![b'x'; len]).unwrap();
    }
    let mut ours = tar::Builder::new(Vec::new());
    archive::append_tree(&mut ours, &Dir::open(t.path()).unwrap(), |_| false).unwrap();
    let mut theirs = tar::Builder::new(Vec::new());
    for (name, len) in files {
        let f = fs::File::open(t.path().join(name)).unwrap();
        let st = nix::sys::stat::fstat(&f).unwrap();
        let mut h = archive::header(&st, tar::EntryType::Regular, len as u64);
        theirs.append_data(&mut h, name, f).unwrap();
    }
    assert_eq!(ours.into_inner().unwrap(), theirs.into_inner().unwrap());
}

#[test]
fn a_bounded_walk_stops_at_its_budget_of_names_and_bytes() {
    use super::walk::Budget;
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("b");
    // 3 + 2 + 1 entries, 1 + 1 + 3 + 1 + 3 + 1 = 10 bytes of names.
    fs::create_dir_all(root.join("a/bbb/c")).unwrap();
    fs::write(root.join("a/ddd"), vec![0u8; 7]).unwrap();
    fs::write(root.join("e"), vec![0u8; 11]).unwrap();
    fs::create_dir(root.join("f")).unwrap();
    let dir = Dir::open(&root).unwrap();
    let whole = tree::size(&dir).unwrap();
    let within = |names, bytes| tree::size_within(&dir, Budget { names, bytes }).unwrap();
    assert_eq!(within(6, 10), Some(whole));
    assert_eq!(within(5, 10), None);
    assert_eq!(within(6, 9), None);
    assert_eq!(within(usize::MAX, usize::MAX), Some(whole));
    // One directory of many entries is never listed past the budget.
    let wide = t.path().join("wide");
    fs::create_dir(&wide).unwrap();
    for i in 0..1000 {
        fs::write(wide.join(format!("{i:04}")), b"").unwrap();
    }
    let wide = Dir::open(&wide).unwrap();
    assert_eq!(
        tree::size_within(
            &wide,
            Budget {
                names: 999,
                bytes: usize::MAX
            }
        )
        .unwrap(),
        None
    );
    assert!(tree::size_within(
        &wide,
        Budget {
            names: 1000,
            bytes: 4000
        }
    )
    .unwrap()
    .is_some());
    assert_eq!(
        tree::size_within(
            &wide,
            Budget {
                names: 1000,
                bytes: 3999
            }
        )
        .unwrap(),
        None
    );
}

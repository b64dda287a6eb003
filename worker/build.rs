include!("../build-support/commit.rs");

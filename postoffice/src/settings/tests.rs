//! Tests of the settings table.

use super::*;

/// The README's table of variables is [`markdown`]'s output, between its
/// two markers. `PSLITE_BLESS=1` rewrites it.
#[test]
fn readme_table_is_the_declaration() {
    const BEGIN: &str = "<!-- settings table: generated from postoffice/src/settings.rs -->\n";
    const END: &str = "<!-- end of settings table -->";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    let readme = std::fs::read_to_string(path).expect("README.md");
    let (before, rest) = readme.split_once(BEGIN).expect("the README's begin marker");
    let (table, after) = rest.split_once(END).expect("the README's end marker");
    let fresh = markdown();
    if table != fresh {
        if std::env::var_os("PSLITE_BLESS").is_some() {
            std::fs::write(path, format!("{before}{BEGIN}{fresh}{END}{after}")).expect("write");
            return;
        }
        panic!(
            "README.md's table of variables differs from postoffice/src/settings.rs: run \
             PSLITE_BLESS=1 cargo test --release -p pslite-postoffice --lib readme"
        );
    }
}

#[test]
fn every_variable_is_declared_once_with_a_doc() {
    let mut names: Vec<_> = SETTINGS.iter().map(|s| s.name()).collect();
    let count = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), count, "a variable declared twice");
    assert_eq!(count, 54, "45 DMLC_*/PS_* variables, PORT and 8 PSLITE_*");
    for s in SETTINGS {
        assert!(
            !s.doc().is_empty() && !s.readers().is_empty(),
            "{}",
            s.name()
        );
        assert!(!s.doc().contains('\n'), "{}", s.name());
    }
    assert!(help().contains("PS_VERBOSE"));
}

#[test]
fn lookups_read_the_launch_variables_first() {
    let vars = vec![("PS_REPLICAS".to_string(), "2".to_string())];
    assert_eq!(PS_REPLICAS.read(&overlay(&vars)), Ok(2));
    let bad = vec![("PS_DROP_MSG".to_string(), "101".to_string())];
    assert!(check(&overlay(&bad))
        .unwrap_err()
        .to_string()
        .starts_with("PS_DROP_MSG must be a percentage from 0 to 100"));
    assert!(check(&|_| None).is_ok(), "unset is no error at the check");
}

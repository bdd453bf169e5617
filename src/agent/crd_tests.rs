//! `crd.rs`'s tests, in a file of their own.

use super::*;

#[test]
fn crd_has_the_columns_kubectl_shows() {
    let crd = crd();
    assert_eq!(crd.spec.group, "drover.dev");
    assert_eq!(crd.spec.names.short_names, Some(vec!["dst".to_string()]));
    assert_eq!(crd.spec.scope, "Namespaced");
    let v = &crd.spec.versions[0];
    assert_eq!(v.name, "v1alpha1");
    assert!(v
        .subresources
        .as_ref()
        .and_then(|s| s.status.as_ref())
        .is_some());
    let cols: Vec<_> = v
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        cols,
        [
            "Environment",
            "Target",
            "State",
            "Blocker",
            "Ready",
            "At Version",
            "Up-to-date",
            "In Flight",
            "Next Window",
            "Commit",
            "Message",
            "Age"
        ]
    );
}

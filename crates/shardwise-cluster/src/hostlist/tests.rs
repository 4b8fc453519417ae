//! Unit tests of [`super`].
use super::*;

fn ok(list: &str) -> Vec<String> {
    match expand(list) {
        Ok(v) => v,
        Err(e) => panic!("expand({list:?}) failed: {e}"),
    }
}

fn err(list: &str) -> HostlistError {
    match expand(list) {
        Ok(v) => panic!("expand({list:?}) should fail, got {v:?}"),
        Err(e) => e,
    }
}

#[test]
fn simple_lists() {
    assert_eq!(ok("node1"), ["node1"]);
    assert_eq!(ok("node1,node2"), ["node1", "node2"]);
    assert_eq!(ok("node1 node2\tnode3\nnode4"), ["node1", "node2", "node3", "node4"]);
    assert_eq!(ok(" node1 , node2 ,"), ["node1", "node2"]);
    assert_eq!(ok("a,,b"), ["a", "b"]);
    assert_eq!(ok("host_1.example.com"), ["host_1.example.com"]);
}

#[test]
fn padding_follows_low_bound() {
    assert_eq!(ok("node[01-04,07]"), ["node01", "node02", "node03", "node04", "node07"]);
    assert_eq!(ok("n[8-11]"), ["n8", "n9", "n10", "n11"]);
    assert_eq!(ok("n[098-100]"), ["n098", "n099", "n100"]);
    assert_eq!(ok("n[9-010]"), ["n9", "n10"]);
    assert_eq!(ok("n[000-002]"), ["n000", "n001", "n002"]);
    assert_eq!(ok("n[0]"), ["n0"]);
}

#[test]
fn reference_sample() {
    assert_eq!(ok("gnode[10,20,25,37]"), ["gnode10", "gnode20", "gnode25", "gnode37"]);
    assert_eq!(ok("tux[0-2,12]"), ["tux0", "tux1", "tux2", "tux12"]);
}

#[test]
fn several_groups_and_suffixes() {
    assert_eq!(ok("r[1-2]n[1-2]"), ["r1n1", "r1n2", "r2n1", "r2n2"]);
    assert_eq!(ok("a1,b[2-3]-ib"), ["a1", "b2-ib", "b3-ib"]);
    assert_eq!(ok("n[1-2]-ib"), ["n1-ib", "n2-ib"]);
    assert_eq!(ok("[1-2]"), ["1", "2"]);
    assert_eq!(ok("x[1,2][3]"), ["x13", "x23"]);
    assert_eq!(
        ok("r[1-2]n[01-02]-ib.local, login"),
        ["r1n01-ib.local", "r1n02-ib.local", "r2n01-ib.local", "r2n02-ib.local", "login"]
    );
}

#[test]
fn keeps_order_and_duplicates() {
    assert_eq!(ok("b,a,b"), ["b", "a", "b"]);
    assert_eq!(ok("n[3,1-2,1]"), ["n3", "n1", "n2", "n1"]);
}

#[test]
fn empty_input() {
    for input in ["", "   ", ",", " , \t"] {
        assert_eq!(err(input), HostlistError::Empty { input: input.into() });
    }
    assert!(err("").to_string().contains("empty hostlist"));
}

#[test]
fn unbalanced_brackets() {
    let e = err("n[1-2");
    assert_eq!(
        e,
        HostlistError::UnbalancedBrackets { input: "n[1-2".into(), position: 1, detail: "`[` is never closed" }
    );
    assert!(e.to_string().contains("position 1"), "{e}");
    assert!(matches!(err("n1-2]"), HostlistError::UnbalancedBrackets { position: 4, .. }));
    assert!(matches!(err("a,n]0["), HostlistError::UnbalancedBrackets { position: 3, .. }));
    assert!(matches!(err("n[1[2]]"), HostlistError::UnbalancedBrackets { position: 3, .. }));
}

#[test]
fn empty_range() {
    assert_eq!(err("n[]"), HostlistError::EmptyRange { input: "n[]".into(), position: 2 });
    assert!(matches!(err("n[1,,2]"), HostlistError::EmptyRange { position: 4, .. }));
    assert!(matches!(err("n[1,]"), HostlistError::EmptyRange { position: 4, .. }));
    assert!(matches!(err("n[,1]"), HostlistError::EmptyRange { position: 2, .. }));
}

#[test]
fn reversed_range() {
    let e = err("n[5-3]");
    assert_eq!(
        e,
        HostlistError::ReversedRange { input: "n[5-3]".into(), position: 2, range: "5-3".into(), lo: 5, hi: 3 }
    );
    let msg = e.to_string();
    assert!(msg.contains("`5-3`") && msg.contains("position 2"), "{msg}");
}

#[test]
fn non_numeric_range() {
    for (input, range, position) in [
        ("n[a-b]", "a-b", 2),
        ("n[1-]", "1-", 2),
        ("n[-1]", "-1", 2),
        ("n[1-2-3]", "1-2-3", 2),
        ("n[1, 2]", " 2", 4),
        ("n[x]", "x", 2),
        ("n[1-2,0x3]", "0x3", 6),
    ] {
        assert_eq!(
            err(input),
            HostlistError::NonNumericRange { input: input.into(), position, range: range.into() },
            "{input}"
        );
    }
    assert!(err("n[a]").to_string().contains("expected a non-negative integer"));
}

#[test]
fn number_too_large() {
    assert!(matches!(err("n[99999999999999999999]"), HostlistError::NumberTooLarge { position: 2, .. }));
    assert!(matches!(err("n[1-99999999999999999999]"), HostlistError::NumberTooLarge { position: 4, .. }));
}

#[test]
fn too_many_hosts() {
    let e = err("a,n[0-999999999]");
    assert_eq!(
        e,
        HostlistError::TooManyHosts {
            input: "a,n[0-999999999]".into(),
            position: 2,
            text: "n[0-999999999]".into(),
            limit: MAX_EXPANDED_HOSTS
        }
    );
    assert!(e.to_string().contains("MAX_EXPANDED_HOSTS"));
    // Product of groups, and the u64 overflow path.
    assert!(matches!(err("r[1-2048]n[1-1024]"), HostlistError::TooManyHosts { .. }));
    assert!(matches!(err("n[0-18446744073709551615]"), HostlistError::TooManyHosts { .. }));
    assert!(matches!(err("a[0-4294967296]b[0-4294967296]"), HostlistError::TooManyHosts { .. }));
    // The limit is on the running total across hosts.
    let half = format!("n[1-{}]", MAX_EXPANDED_HOSTS / 2);
    assert!(matches!(
        err(&format!("{half},{half},x")),
        HostlistError::TooManyHosts { position, .. } if position == 2 * half.len() + 2
    ));
    // Exactly at the limit is fine.
    assert_eq!(ok(&format!("n[1-{MAX_EXPANDED_HOSTS}]")).len(), MAX_EXPANDED_HOSTS);
}

#[test]
fn tasks_per_node() {
    let t = |s: &str| match expand_tasks_per_node(s) {
        Ok(v) => v,
        Err(e) => panic!("{s:?}: {e}"),
    };
    assert_eq!(t("2(x3),1"), [2, 2, 2, 1]);
    assert_eq!(t("1(x4)"), [1, 1, 1, 1]);
    assert_eq!(t("4"), [4]);
    assert_eq!(t("8, 4(x2)"), [8, 4, 4]);
    assert_eq!(t("0"), [0]);
}

#[test]
fn tasks_per_node_errors() {
    assert!(matches!(expand_tasks_per_node(""), Err(HostlistError::Empty { .. })));
    assert!(matches!(expand_tasks_per_node("  "), Err(HostlistError::Empty { .. })));
    for (input, element, position) in [
        ("2(x3),", "", 6),
        ("a", "a", 0),
        ("2(3)", "2(3)", 0),
        ("2(x)", "2(x)", 0),
        ("2(x0)", "2(x0)", 0),
        ("2(xa)", "2(xa)", 0),
        ("(x2)", "(x2)", 0),
        ("1, -1", "-1", 3),
        ("2(x3", "2(x3", 0),
        ("99999999999", "99999999999", 0),
    ] {
        assert_eq!(
            expand_tasks_per_node(input),
            Err(HostlistError::InvalidTasksPerNode { input: input.into(), position, element: element.into() }),
            "{input}"
        );
    }
    assert!(matches!(expand_tasks_per_node("1(x999999999999)"), Err(HostlistError::TooManyHosts { .. })));
    assert!(matches!(
        expand_tasks_per_node("1(x99999999999999999999999)"),
        Err(HostlistError::InvalidTasksPerNode { .. })
    ));
}

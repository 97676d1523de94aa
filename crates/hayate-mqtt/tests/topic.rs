//! Topic names, topic filters and shared subscriptions (sections 4.7 and 4.8.2), with the
//! specification's examples.

use hayate_mqtt::{
    SharedSubscription, has_wildcards, shared_subscription, valid_topic_filter, valid_topic_name,
};

#[test]
fn topic_names() {
    for ok in [
        "a",
        "sport/tennis/player1",
        "/",
        "/finance",
        "a//b",
        "$SYS/broker/load",
        " ",
        "ACCOUNTS",
        "é/日本",
    ] {
        assert!(valid_topic_name(ok), "{ok:?}");
    }
    for bad in ["", "+", "#", "a/+", "a/#", "sport+", "a\0b"] {
        assert!(!valid_topic_name(bad), "{bad:?}");
    }
    assert!(valid_topic_name(&"a".repeat(65_535)));
    assert!(!valid_topic_name(&"a".repeat(65_536)));
}

/// The examples of 4.7.1.2 and 4.7.1.3.
#[test]
fn topic_filters_spec_examples() {
    for ok in [
        "sport/tennis/player1/#",
        "sport/#",
        "#",
        "+",
        "+/tennis/#",
        "sport/+/player1",
        "+/+",
        "/+",
        "sport/tennis/#",
        "$SYS/#",
    ] {
        assert!(valid_topic_filter(ok), "{ok:?}");
    }
    for bad in [
        "sport/tennis#",
        "sport/tennis/#/ranking",
        "sport+",
        "",
        "a/b+/c",
        "#/a",
        "a\0",
    ] {
        assert!(!valid_topic_filter(bad), "{bad:?}");
    }
    assert!(valid_topic_filter("//"));
    assert!(!valid_topic_filter(&"a".repeat(65_536)));
    assert!(has_wildcards("a/+/b") && has_wildcards("#") && !has_wildcards("a/b"));
}

#[test]
fn shared_subscriptions() {
    assert_eq!(
        shared_subscription("$share/consumer1/sport/tennis/+"),
        Some(SharedSubscription {
            group: "consumer1",
            filter: "sport/tennis/+"
        })
    );
    assert_eq!(
        shared_subscription("$share/g/#"),
        Some(SharedSubscription {
            group: "g",
            filter: "#"
        })
    );
    // The inner filter may start with a slash.
    assert_eq!(
        shared_subscription("$share/consumer2//finance"),
        Some(SharedSubscription {
            group: "consumer2",
            filter: "/finance"
        })
    );
    for not_shared in ["sport/#", "$share", "$SHARE/g/a", "share/g/a"] {
        assert_eq!(shared_subscription(not_shared), None, "{not_shared:?}");
    }
    for bad in [
        "$share/g",
        "$share/",
        "$share//a",
        "$share/g#/a",
        "$share/+/a",
        "$share/g/",
        "$share/g/a/#/b",
    ] {
        assert_eq!(shared_subscription(bad), None, "{bad:?}");
        assert!(!valid_topic_filter(bad), "{bad:?}");
    }
    assert!(valid_topic_filter("$share/g/a/+"));
    // Not a shared subscription: only `$share/` is special.
    assert!(valid_topic_filter("$share"));
    assert!(valid_topic_filter("$sharex/a"));
}

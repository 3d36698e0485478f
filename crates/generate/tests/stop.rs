//! Stop strings over streamed pieces: held back while they might still match, never emitted.

use oxgen_generate::{StopCheck, StopStrings};

fn stops(list: &[&str]) -> StopStrings {
    StopStrings::new(list.iter().map(|s| s.to_string()).collect())
}

/// Feeds `pieces`; returns everything emitted (including `finish` when no stop matched) and
/// the stop that matched.
fn stream(s: &mut StopStrings, pieces: &[&str]) -> (String, Option<usize>) {
    let mut out = String::new();
    for piece in pieces {
        match s.push(piece) {
            StopCheck::Continue(text) => out.push_str(text),
            StopCheck::Stop { text, which } => {
                out.push_str(text);
                return (out, Some(which));
            }
        }
    }
    out.push_str(s.finish());
    (out, None)
}

#[test]
fn a_stop_string_split_over_three_pieces_is_held_then_dropped() {
    let mut s = stops(&["<END>"]);
    assert_eq!(s.push("hello <"), StopCheck::Continue("hello "));
    assert_eq!(s.push("EN"), StopCheck::Continue(""));
    assert_eq!(
        s.push("D> and more"),
        StopCheck::Stop { text: "", which: 0 }
    );
    assert_eq!(
        s.push("later"),
        StopCheck::Stop { text: "", which: 0 },
        "the stream stays stopped"
    );
    assert_eq!(s.finish(), "");
}

#[test]
fn a_near_miss_is_released_as_soon_as_it_stops_matching() {
    let mut s = stops(&["<END>"]);
    assert_eq!(s.push("a <E"), StopCheck::Continue("a "));
    assert_eq!(s.push("NX"), StopCheck::Continue("<ENX"));
    // The released text may itself end in a new candidate.
    assert_eq!(s.push(" <<"), StopCheck::Continue(" <"));
    assert_eq!(s.push("x"), StopCheck::Continue("<x"));
    assert_eq!(s.finish(), "");
}

#[test]
fn the_stop_that_completes_first_wins_whatever_the_pieces() {
    let list = ["abcd", "bc", "zz"];
    // "bc" ends at byte 3, before "abcd" ends at byte 4, so "a" is emitted and "bc" wins,
    // however the text is cut.
    for pieces in [
        vec!["abcd"],
        vec!["a", "b", "c", "d"],
        vec!["ab", "cd"],
        vec!["xabcdzz"],
    ] {
        let (out, which) = stream(&mut stops(&list), &pieces);
        let expected = if pieces[0].starts_with('x') {
            "xa"
        } else {
            "a"
        };
        assert_eq!((out.as_str(), which), (expected, Some(1)), "{pieces:?}");
    }
}

#[test]
fn stops_ending_together_go_to_the_longer_then_to_the_first_listed() {
    let (out, which) = stream(&mut stops(&["bc", "abc"]), &["xab", "c"]);
    assert_eq!(
        (out.as_str(), which),
        ("x", Some(1)),
        "the longer one starts earlier"
    );
    let (out, which) = stream(&mut stops(&["stop", "stop"]), &["a stop"]);
    assert_eq!((out.as_str(), which), ("a ", Some(0)));
}

#[test]
fn two_stop_strings_each_match_and_report_their_index() {
    let list = ["\n\nUser:", "</s>"];
    let (out, which) = stream(&mut stops(&list), &["Sure.", "\n\n", "Us", "er:", " hi"]);
    assert_eq!((out.as_str(), which), ("Sure.", Some(0)));
    let (out, which) = stream(&mut stops(&list), &["Sure.", "\n", "</", "s>"]);
    assert_eq!((out.as_str(), which), ("Sure.\n", Some(1)));
}

#[test]
fn empty_stop_strings_are_ignored_but_indices_are_kept() {
    let mut s = stops(&["", "x"]);
    assert!(!s.is_empty());
    assert_eq!(
        s.push("abx"),
        StopCheck::Stop {
            text: "ab",
            which: 1
        }
    );
    let mut none = stops(&[""]);
    assert!(none.is_empty());
    assert_eq!(none.push("anything"), StopCheck::Continue("anything"));
}

#[test]
fn a_stop_at_the_very_start_emits_nothing() {
    let mut s = stops(&["###"]);
    assert_eq!(s.push("###"), StopCheck::Stop { text: "", which: 0 });
    let mut s = stops(&["###"]);
    assert_eq!(s.push("#"), StopCheck::Continue(""));
    assert_eq!(s.push("##tail"), StopCheck::Stop { text: "", which: 0 });
}

#[test]
fn text_after_a_stop_inside_a_piece_is_dropped() {
    let mut s = stops(&["STOP"]);
    assert_eq!(s.push("one "), StopCheck::Continue("one "));
    assert_eq!(
        s.push("two STOP three"),
        StopCheck::Stop {
            text: "two ",
            which: 0
        }
    );
}

#[test]
fn held_text_and_stops_never_split_a_character() {
    // "€" is E2 82 AC and "é" is C3 A9; the stop starts with "€".
    let mut s = stops(&["€€"]);
    assert_eq!(s.push("café €"), StopCheck::Continue("café "));
    assert_eq!(s.push("x€"), StopCheck::Continue("€x"));
    assert_eq!(s.push("€"), StopCheck::Stop { text: "", which: 0 });

    // A stop sharing a first byte (E2) with the text but not its character is no prefix.
    let mut s = stops(&["→"]); // E2 86 92
    assert_eq!(s.push("€"), StopCheck::Continue("€"));
    let (out, which) = stream(&mut stops(&["🙂!"]), &["ok 🙂", "🙂", "!", "more"]);
    assert_eq!((out.as_str(), which), ("ok 🙂", Some(0)));
}

#[test]
fn finish_releases_held_text_once() {
    let mut s = stops(&["</answer>"]);
    assert_eq!(s.push("42 </ans"), StopCheck::Continue("42 "));
    assert_eq!(s.finish(), "</ans");
    assert_eq!(s.finish(), "", "finish hands the held text out once");
}

#[test]
fn reset_starts_a_new_stream_with_the_same_stops() {
    let mut s = stops(&["END"]);
    assert_eq!(s.push("xEN"), StopCheck::Continue("x"));
    s.reset();
    assert_eq!(
        s.push("D"),
        StopCheck::Continue("D"),
        "the held 'EN' is forgotten"
    );
    assert_eq!(s.push("END"), StopCheck::Stop { text: "", which: 0 });
    s.reset();
    assert_eq!(
        s.push("ok"),
        StopCheck::Continue("ok"),
        "the stop is forgotten"
    );
}

#[test]
fn any_split_of_a_text_gives_the_same_result() {
    let text = "the answer is 4 <|eot|> and then <|eot";
    let list = ["<|eot|>", "answer is 5", "4 <"];
    let whole = stream(&mut stops(&list), &[text]);
    assert_eq!(whole, ("the answer is ".to_string(), Some(2)));
    // Every split into pieces of 1..=5 bytes, cut on character boundaries.
    for width in 1..=5 {
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut cut = width.min(rest.len());
            while !rest.is_char_boundary(cut) {
                cut += 1;
            }
            pieces.push(&rest[..cut]);
            rest = &rest[cut..];
        }
        assert_eq!(stream(&mut stops(&list), &pieces), whole, "width {width}");
    }
    let plain = "no stop here <|eo";
    for width in 1..=4 {
        let pieces: Vec<&str> = plain
            .as_bytes()
            .chunks(width)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        assert_eq!(
            stream(&mut stops(&list), &pieces),
            (plain.to_string(), None),
            "held text comes back from finish"
        );
    }
}

//! Wire transcripts of the path operations (`stat`, `list`, `mkdir`,
//! `remove`, `rename`), pinned with insta: every request as the client
//! sent it (`->`), every response as the machine framed it (`<-`).

use airlock_core::fsproxy::{Config, StdioRole};
use airlock_core::fuzzing::{test_fs, test_policy, Event, Shell};
use airlock_core::handles::ClientId;

const C: ClientId = ClientId(1);

fn transcript(config: Config, requests: &[&str]) -> String {
    let mut s = Shell::new(config, test_fs());
    s.connect(C);
    let mut out = String::new();
    for text in requests {
        let seen = s.events.len();
        out += &format!("-> {text}\n");
        s.send(C, text.as_bytes());
        for e in &s.events[seen..] {
            if let Event::Sent(_, payload) = e {
                out += &format!("<- {}\n", String::from_utf8_lossy(payload));
            }
        }
    }
    out
}

#[test]
fn path_ops_on_host_files() {
    insta::assert_snapshot!(transcript(
        Config::new(test_policy(), StdioRole::Local),
        &[
            r#"{"id":"1","op":"stat","params":{"path":"/rw/notes.txt"}}"#,
            r#"{"id":"2","op":"stat","params":{"path":"/rw/missing"}}"#,
            r#"{"id":"3","op":"stat","params":{"path":"/etc/passwd"}}"#,
            r#"{"id":"4","op":"mkdir","params":{"path":"/rw/a/b"}}"#,
            r#"{"id":"5","op":"mkdir","params":{"path":"/rw/a/b","parents":true}}"#,
            r#"{"id":"6","op":"mkdir","params":{"path":"/rw/a"}}"#,
            r#"{"id":"7","op":"list","params":{"path":"/rw","max":1}}"#,
            r#"{"id":"8","op":"list","params":{"path":"/rw","after":"a"}}"#,
            r#"{"id":"9","op":"rename","params":{"from":"/rw/notes.txt","to":"/rw/a/n.txt","noreplace":true}}"#,
            r#"{"id":"10","op":"rename","params":{"from":"/rw/a/n.txt","to":"/ro/n.txt"}}"#,
            r#"{"id":"11","op":"remove","params":{"path":"/rw/a"}}"#,
            r#"{"id":"12","op":"remove","params":{"path":"/rw/a/n.txt"}}"#,
            r#"{"id":"13","op":"remove","params":{"path":"/ro/hello.txt"}}"#,
            r#"{"id":"14","op":"rename","params":{"from":"/rw/a","to":"virtual"}}"#,
            r#"{"id":"15","op":"list","params":{"path":"/rw","max":0}}"#,
            r#"{"id":"16","op":"list","params":{"path":"/rw","after":"a/b"}}"#,
            r#"{"id":"17","op":"rename","params":{"from":"/rw/a"}}"#,
            r#"{"id":"18","op":"stat","params":{"path":"/rw","follow":"yes"}}"#,
        ],
    ));
}

#[test]
fn path_ops_on_virtual_files() {
    insta::assert_snapshot!(transcript(
        Config::new(test_policy(), StdioRole::Local),
        &[
            r#"{"id":"1","op":"open","params":{"path":"out/new/deep.txt","mode":"w"}}"#,
            r#"{"id":"2","op":"list","params":{"path":"."}}"#,
            r#"{"id":"3","op":"stat","params":{"path":"out/new"}}"#,
            r#"{"id":"4","op":"mkdir","params":{"path":"empty"}}"#,
            r#"{"id":"5","op":"rename","params":{"from":"out","to":"moved"}}"#,
            r#"{"id":"6","op":"list","params":{"path":"moved/new"}}"#,
            r#"{"id":"7","op":"remove","params":{"path":"moved"}}"#,
            r#"{"id":"8","op":"remove","params":{"path":"moved/new/deep.txt"}}"#,
            r#"{"id":"9","op":"write","params":{"h":3,"data":"c3RpbGwgaGVyZQ=="}}"#,
            r#"{"id":"10","op":"stat","params":{"path":"moved/new/deep.txt"}}"#,
            r#"{"id":"11","op":"remove","params":{"path":"."}}"#,
            r#"{"id":"12","op":"stat","params":{"path":"../up"}}"#,
        ],
    ));
}

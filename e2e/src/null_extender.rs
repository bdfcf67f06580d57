//! A do-nothing scheduler extender (filter echoes `NodeNames`, prioritize scores every node
//! 0) on loopback, HTTP/1.1 keep-alive, one thread per connection: the floor of what the
//! extender protocol itself costs kube-scheduler, to compare Kudos against.

use anyhow::Result;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};

/// Starts the server; returns its `http://127.0.0.1:<port>` URL prefix (verbs `filter`,
/// `prioritize`). It lives until the process exits.
pub fn start() -> Result<String> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", l.local_addr()?);
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = serve(c);
            });
        }
    });
    Ok(url)
}

fn serve(c: TcpStream) -> Result<()> {
    c.set_nodelay(true)?;
    let mut w = c.try_clone()?;
    let mut r = BufReader::new(c);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            r.read_line(&mut h)?;
            if h == "\r\n" || h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body)?;
        let args: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let names = args["NodeNames"].as_array().cloned().unwrap_or_default();
        let out = if path.ends_with("/prioritize") {
            Value::Array(
                names
                    .iter()
                    .map(|n| json!({"Host": n, "Score": 0}))
                    .collect(),
            )
        } else {
            json!({"NodeNames": names, "FailedNodes": {}, "Error": ""})
        };
        let b = out.to_string();
        write!(
            w,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )?;
        w.flush()?;
    }
}

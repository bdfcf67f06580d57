//! Headless Chromium (Debian's `chromium`) pointed at a page, as an operator's browser would
//! render it: the DOM after rendering and a screenshot, decoded here (PNG, 8-bit RGB/RGBA) so
//! a test can check what the page shows, not only what the server sent.
//!
//! Chromium's profile, cache and crash files go to a directory under the run directory
//! (`--user-data-dir`, `HOME`), so the host keeps none of them.

use anyhow::{Context, Result, bail, ensure};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian's Chromium.
pub fn chromium_bin() -> PathBuf {
    crate::paths::system_bin("chromium")
}

fn chromium(dir: &Path) -> Command {
    let mut c = Command::new(chromium_bin());
    c.env("HOME", dir)
        .arg("--headless")
        // Root (the real-node tests run as root) cannot use Chromium's sandbox.
        .arg("--no-sandbox")
        .arg("--disable-gpu")
        .arg("--no-first-run")
        .arg(format!("--user-data-dir={}", dir.join("profile").display()));
    c
}

/// Runs one headless Chromium command; its stdout, or an error with its stderr.
fn run(mut cmd: Command, what: &str) -> Result<Vec<u8>> {
    let out = cmd.output().with_context(|| format!("run {what}"))?;
    ensure!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

/// The DOM of `url` after rendering, and a `width`×`height` screenshot of it, written as
/// `dir/screenshot.png` and decoded.
pub fn render(url: &str, dir: &Path, width: u32, height: u32) -> Result<(String, Image)> {
    std::fs::create_dir_all(dir)?;
    let mut dump = chromium(dir);
    dump.arg("--dump-dom").arg(url);
    let dom =
        String::from_utf8_lossy(&run(dump, &format!("chromium --dump-dom {url}"))?).into_owned();
    let png = dir.join("screenshot.png");
    let mut shot = chromium(dir);
    shot.arg(format!("--screenshot={}", png.display()))
        .arg(format!("--window-size={width},{height}"))
        .arg("--hide-scrollbars")
        .arg(url);
    run(shot, &format!("chromium --screenshot {url}"))?;
    let image = Image::decode(&std::fs::read(&png).with_context(|| png.display().to_string())?)?;
    Ok((dom, image))
}

/// A decoded screenshot: RGB pixels, row by row.
#[derive(Debug)]
pub struct Image {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// `width * height` RGB triples.
    pub pixels: Vec<[u8; 3]>,
}

impl Image {
    /// Decodes a non-interlaced 8-bit RGB or RGBA PNG (what Chromium writes).
    pub fn decode(png: &[u8]) -> Result<Self> {
        ensure!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        let (mut width, mut height, mut channels) = (0u32, 0u32, 0usize);
        let mut idat = Vec::new();
        let mut at = 8;
        while at + 8 <= png.len() {
            let len = u32::from_be_bytes(png[at..at + 4].try_into()?) as usize;
            let kind = &png[at + 4..at + 8];
            let data = png
                .get(at + 8..at + 8 + len)
                .context("truncated PNG chunk")?;
            match kind {
                b"IHDR" => {
                    width = u32::from_be_bytes(data[0..4].try_into()?);
                    height = u32::from_be_bytes(data[4..8].try_into()?);
                    channels = match (data[8], data[9], data[12]) {
                        (8, 2, 0) => 3,
                        (8, 6, 0) => 4,
                        other => bail!("unsupported PNG (depth, colour, interlace) {other:?}"),
                    };
                }
                b"IDAT" => idat.extend_from_slice(data),
                b"IEND" => break,
                _ => {}
            }
            at += 12 + len;
        }
        let stride = width as usize * channels;
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&idat[..]).read_to_end(&mut raw)?;
        ensure!(raw.len() == (stride + 1) * height as usize, "PNG data size");
        let mut prev = vec![0u8; stride];
        let mut pixels = Vec::with_capacity(width as usize * height as usize);
        for row in raw.chunks(stride + 1) {
            let (filter, line) = (row[0], &row[1..]);
            let mut cur = vec![0u8; stride];
            for i in 0..stride {
                let a = if i >= channels { cur[i - channels] } else { 0 };
                let b = prev[i];
                let c = if i >= channels { prev[i - channels] } else { 0 };
                let pred = match filter {
                    0 => 0,
                    1 => a,
                    2 => b,
                    3 => ((u16::from(a) + u16::from(b)) / 2) as u8,
                    4 => {
                        let p = i16::from(a) + i16::from(b) - i16::from(c);
                        let (pa, pb, pc) = (
                            (p - i16::from(a)).abs(),
                            (p - i16::from(b)).abs(),
                            (p - i16::from(c)).abs(),
                        );
                        if pa <= pb && pa <= pc {
                            a
                        } else if pb <= pc {
                            b
                        } else {
                            c
                        }
                    }
                    f => bail!("bad PNG filter {f}"),
                };
                cur[i] = line[i].wrapping_add(pred);
            }
            pixels.extend(cur.chunks(channels).map(|p| [p[0], p[1], p[2]]));
            prev = cur;
        }
        Ok(Self {
            width,
            height,
            pixels,
        })
    }

    /// Pixels for which `f(r, g, b)` holds.
    pub fn count(&self, f: impl Fn(u8, u8, u8) -> bool) -> usize {
        self.pixels.iter().filter(|p| f(p[0], p[1], p[2])).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        out.extend_from_slice(&[0; 4]); // CRC, not checked
    }

    #[test]
    fn decodes_filtered_rgba_rows() {
        // 2x2 RGBA: row 0 with Sub, row 1 with Up.
        let rows: [&[u8]; 2] = [
            &[1, 10, 20, 30, 255, 5, 5, 5, 0],
            &[2, 1, 1, 1, 0, 2, 2, 2, 0],
        ];
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        for r in rows {
            z.write_all(r).unwrap();
        }
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&2u32.to_be_bytes());
        ihdr.extend_from_slice(&2u32.to_be_bytes());
        ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
        chunk(&mut png, b"IHDR", &ihdr);
        chunk(&mut png, b"IDAT", &z.finish().unwrap());
        chunk(&mut png, b"IEND", &[]);
        let img = Image::decode(&png).unwrap();
        assert_eq!((img.width, img.height), (2, 2));
        assert_eq!(
            img.pixels,
            [[10, 20, 30], [15, 25, 35], [11, 21, 31], [17, 27, 37]]
        );
        assert_eq!(img.count(|r, _, _| r > 12), 2);
    }
}

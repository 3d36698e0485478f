//! A conversation: its messages, rendered with the package's template each turn. The model
//! keeps the KV of the last generation, so a turn prefills only what it adds to the
//! conversation so far. A conversation is saved with that KV ([`Chat::save`]) and resumes
//! without a prefill ([`Chat::load`]).
//!
//! A saved session is one file: a magic line, the KV's bytes block by block (as the backend
//! wrote them), then a JSON trailer (the model's identity, the messages, the ids the KV
//! holds, its layout and SHA-256) and the trailer's length as 8 little-endian bytes. It is
//! written to a temporary file and renamed.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::identity::hex;
use crate::{ChatMessage, Error, GenerateOptions, KvDtype, Model, Output, Prompt};

const MAGIC: &[u8] = b"oxgen-session 1\n";

/// Positions a conversation's KV holds where the caller does not say (`oxgen run`, the
/// Python package): a fixed size, so each turn fits the KV of the turns before it and only
/// prefills what it adds (clamped to the model's context like any `ctx_size`).
pub const CHAT_CTX_SIZE: usize = 4096;

/// The messages of a chat, with an optional system prompt.
///
/// ```no_run
/// use oxgen::{Chat, Model, ModelOptions};
///
/// let mut model = Model::open("path/to/package", &ModelOptions::default())?;
/// let options = model.default_options();
/// let mut chat = Chat::new(Some("You are terse."));
/// chat.send(&mut model, "Name a color.", &options, |t| print!("{t}"))?;
/// let out = chat.send(&mut model, "Another one.", &options, |t| print!("{t}"))?;
/// // The second turn prefilled only its own tokens.
/// assert!(out.usage.prefix_reused > 0);
/// # Ok::<(), oxgen::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Chat {
    system: Option<String>,
    messages: Vec<ChatMessage>,
}

impl Chat {
    pub fn new(system: Option<&str>) -> Chat {
        Chat {
            system: system.map(str::to_string),
            messages: Vec::new(),
        }
    }

    /// Replaces the system prompt (the conversation goes on).
    pub fn set_system(&mut self, system: Option<&str>) {
        self.system = system.map(str::to_string);
    }

    /// Forgets the messages; the system prompt stays.
    pub fn clear(&mut self) {
        self.messages.clear();
    }

    /// The user and assistant messages so far.
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// Every message the template sees, system prompt first.
    pub fn prompt(&self) -> Prompt {
        let system = self.system.iter().map(|s| ChatMessage::new("system", s));
        Prompt::Chat(system.chain(self.messages.iter().cloned()).collect())
    }

    /// Saves the conversation to `path`, with the KV the model kept from its last reply when
    /// the backend can save it (the native backend, paged models). Returns the positions of
    /// KV saved (0: the messages alone; loading them prefills the conversation again).
    pub fn save(&self, model: &mut Model, path: impl AsRef<Path>) -> Result<usize, Error> {
        let path = path.as_ref();
        let fail = |e: &dyn std::fmt::Display| Error::Package {
            path: path.display().to_string(),
            reason: format!("cannot save the session: {e}"),
        };
        let identity = model.identity()?.to_string();
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = (|| -> Result<usize, Error> {
            let mut out = Hashing::new(BufWriter::new(File::create(&tmp).map_err(|e| fail(&e))?));
            out.inner.write_all(MAGIC).map_err(|e| fail(&e))?;
            // A backend that cannot save KV saves the messages alone; one that failed while
            // writing it (a full disk) fails the save.
            let kept = match model.save_kept(&mut out) {
                Ok(kept) => kept,
                Err(_) if out.bytes == 0 => None,
                Err(e) => return Err(e),
            };
            let kv = kept.map(|(ids, ctx_size, format)| SavedKv {
                dtype: format.kv.name().into(),
                block_size: format.block_size,
                block_bytes: format.block_bytes,
                ctx_size,
                bytes: out.bytes,
                sha256: hex(&out.sha.clone().finalize()),
                ids,
            });
            let positions = kv.as_ref().map_or(0, |kv| kv.ids.len());
            let trailer = serde_json::to_vec(&Saved {
                model: identity,
                system: self.system.clone(),
                messages: (self.messages.iter())
                    .map(|m| [m.role.clone(), m.content.clone()])
                    .collect(),
                kv,
            })
            .map_err(|e| fail(&e))?;
            let mut out = out.inner;
            out.write_all(&trailer).map_err(|e| fail(&e))?;
            out.write_all(&(trailer.len() as u64).to_le_bytes())
                .map_err(|e| fail(&e))?;
            out.into_inner()
                .map_err(|e| fail(&e))?
                .sync_all()
                .map_err(|e| fail(&e))?;
            Ok(positions)
        })();
        match written.and_then(|n| {
            std::fs::rename(&tmp, path)
                .map(|()| n)
                .map_err(|e| fail(&e))
        }) {
            Ok(n) => Ok(n),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Reads a conversation [`Chat::save`] wrote, and gives `model` its KV back so the next
    /// turn prefills only what it adds. The KV is left out (and said why in
    /// [`Resumed::note`]) when it was saved by another model, or the backend cannot load it.
    pub fn load(model: &mut Model, path: impl AsRef<Path>) -> Result<Resumed, Error> {
        let path = path.as_ref();
        let fail = |e: &dyn std::fmt::Display| Error::Package {
            path: path.display().to_string(),
            reason: format!("not a saved oxgen session: {e}"),
        };
        let mut file = BufReader::new(File::open(path).map_err(|e| fail(&e))?);
        let mut magic = [0u8; MAGIC.len()];
        file.read_exact(&mut magic).map_err(|e| fail(&e))?;
        if magic != MAGIC {
            return Err(fail(&"it does not start as one"));
        }
        let len = file.seek(SeekFrom::End(-8)).map_err(|e| fail(&e))?;
        let mut n = [0u8; 8];
        file.read_exact(&mut n).map_err(|e| fail(&e))?;
        let n = u64::from_le_bytes(n);
        let start = len
            .checked_sub(n)
            .filter(|&s| s >= MAGIC.len() as u64)
            .ok_or_else(|| fail(&"its trailer's length runs past its start"))?;
        file.seek(SeekFrom::Start(start)).map_err(|e| fail(&e))?;
        let saved: Saved = serde_json::from_reader((&mut file).take(n)).map_err(|e| fail(&e))?;
        let chat = Chat {
            system: saved.system,
            messages: (saved.messages.iter())
                .map(|[role, content]| ChatMessage::new(role, content))
                .collect(),
        };
        let mut resumed = Resumed {
            chat,
            kv_positions: 0,
            note: None,
        };
        let Some(kv) = saved.kv else {
            resumed.note = Some("the session was saved without KV".into());
            return Ok(resumed);
        };
        if saved.model != model.identity()? {
            resumed.note = Some(format!(
                "its KV was saved by another model (identity {}), so the conversation is \
                 prefilled again",
                saved.model
            ));
            return Ok(resumed);
        }
        if start - MAGIC.len() as u64 != kv.bytes {
            return Err(fail(&"its KV is truncated"));
        }
        let format = oxgen_runtime::BlockFormat {
            kv: kv.dtype.parse::<KvDtype>().map_err(|e| fail(&e))?,
            block_size: kv.block_size,
            block_bytes: kv.block_bytes,
        };
        // Checked whole before any of it reaches the model (and its prefix cache).
        fn kv_bytes(file: &mut BufReader<File>, n: u64) -> std::io::Result<Hashing<impl Read>> {
            file.seek(SeekFrom::Start(MAGIC.len() as u64))?;
            Ok(Hashing::new(file.take(n)))
        }
        let sum = {
            let mut check = kv_bytes(&mut file, kv.bytes).map_err(|e| fail(&e))?;
            std::io::copy(&mut check, &mut std::io::sink()).map_err(|e| fail(&e))?;
            check.sha.finalize()
        };
        if hex(&sum) != kv.sha256 {
            return Err(fail(
                &"its KV does not match its checksum (the file was altered)",
            ));
        }
        let mut input = kv_bytes(&mut file, kv.bytes).map_err(|e| fail(&e))?;
        if let Err(e) = model.load_kept(&kv.ids, kv.ctx_size, &format, &mut input) {
            resumed.note = Some(format!("its KV was not loaded ({e})"));
            return Ok(resumed);
        }
        resumed.kv_positions = kv.ids.len();
        Ok(resumed)
    }

    /// Adds `user`, generates the reply (streamed to `on_text`) and adds it. A reply that
    /// fails leaves the conversation as it was.
    pub fn send(
        &mut self,
        model: &mut Model,
        user: &str,
        options: &GenerateOptions,
        on_text: impl FnMut(&str),
    ) -> Result<Output, Error> {
        self.messages.push(ChatMessage::new("user", user));
        match model.generate(&self.prompt(), options, on_text) {
            Ok(out) => {
                self.messages.push(ChatMessage::new("assistant", &out.text));
                Ok(out)
            }
            Err(e) => {
                self.messages.pop();
                Err(e)
            }
        }
    }
}

/// A conversation read back by [`Chat::load`].
#[derive(Debug)]
pub struct Resumed {
    pub chat: Chat,
    /// Positions of KV the model got back (0: the next turn prefills the conversation).
    pub kv_positions: usize,
    /// Why the KV was not loaded, when it was not.
    pub note: Option<String>,
}

/// A saved session's trailer.
#[derive(Serialize, Deserialize)]
struct Saved {
    /// The identity of the model whose KV this is ([`Model::identity`]).
    model: String,
    system: Option<String>,
    /// `[role, content]` of every message.
    messages: Vec<[String; 2]>,
    kv: Option<SavedKv>,
}

#[derive(Serialize, Deserialize)]
struct SavedKv {
    dtype: String,
    block_size: usize,
    block_bytes: usize,
    ctx_size: usize,
    bytes: u64,
    sha256: String,
    /// The ids whose KV it is.
    ids: Vec<u32>,
}

/// A reader or writer that hashes and counts what passes through.
struct Hashing<T> {
    inner: T,
    sha: Sha256,
    bytes: u64,
}

impl<T> Hashing<T> {
    fn new(inner: T) -> Hashing<T> {
        Hashing {
            inner,
            sha: Sha256::new(),
            bytes: 0,
        }
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sha.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

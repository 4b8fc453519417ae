//! The shell's line editor on a thread of its own.
//!
//! Why: rustyline's `readline` blocks until a line is typed. Called on the shell's task, it
//! kept that task from noticing anything else, so `shardwise local` waiting at its prompt
//! ignored SIGTERM and SIGINT (a service manager's stop did nothing, and a SIGKILL then left the
//! temporary data behind). On a thread of its own, the shell awaits each line and can be
//! stopped while it waits. The terminal's settings are saved before the first line is read, so
//! that a shell stopped while the editor has the terminal in raw mode gives it back as it was
//! ([`restore_terminal`]).

use std::path::PathBuf;
use std::sync::{Mutex, mpsc};

use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;
use tokio::sync::oneshot;

/// The terminal's settings before the editor first read a line (none when stdin is not one).
static SAVED_TERMINAL: Mutex<Option<nix::sys::termios::Termios>> = Mutex::new(None);

enum Request {
    Read(&'static str, oneshot::Sender<Result<String, ReadlineError>>),
    AddHistory(String),
    SaveHistory(PathBuf, oneshot::Sender<Result<(), ReadlineError>>),
}

/// The editor's thread, driven by requests. It ends when the reader is dropped and the line
/// being read (if any) is done; a process that exits meanwhile does not wait for it.
pub struct LineReader {
    requests: mpsc::Sender<Request>,
}

impl LineReader {
    pub fn start(mut editor: DefaultEditor) -> std::io::Result<LineReader> {
        if let Ok(settings) = nix::sys::termios::tcgetattr(std::io::stdin())
            && let Ok(mut saved) = SAVED_TERMINAL.lock()
            && saved.is_none()
        {
            *saved = Some(settings);
        }
        let (requests, received) = mpsc::channel::<Request>();
        std::thread::Builder::new().name("line-editor".into()).spawn(move || {
            for request in received {
                match request {
                    Request::Read(prompt, reply) => {
                        let _ = reply.send(editor.readline(prompt));
                    }
                    Request::AddHistory(line) => {
                        let _ = editor.add_history_entry(line);
                    }
                    Request::SaveHistory(path, reply) => {
                        let _ = reply.send(editor.save_history(&path));
                    }
                }
            }
        })?;
        Ok(LineReader { requests })
    }

    /// The next line, or end of input if the editor's thread is gone.
    pub async fn read(&self, prompt: &'static str) -> Result<String, ReadlineError> {
        let (reply, line) = oneshot::channel();
        if self.requests.send(Request::Read(prompt, reply)).is_err() {
            return Err(ReadlineError::Eof);
        }
        line.await.unwrap_or(Err(ReadlineError::Eof))
    }

    pub fn add_history(&self, line: &str) {
        let _ = self.requests.send(Request::AddHistory(line.to_string()));
    }

    pub async fn save_history(&self, path: PathBuf) -> Result<(), ReadlineError> {
        let (reply, saved) = oneshot::channel();
        if self.requests.send(Request::SaveHistory(path, reply)).is_err() {
            return Ok(());
        }
        saved.await.unwrap_or(Ok(()))
    }
}

/// The shell was stopped by SIGINT while it waited for a line (the process exits with 130, as
/// a shell's child stopped by SIGINT does). A Ctrl-C typed at the prompt is not a signal: the
/// editor has the terminal in raw mode and takes it as a key (it drops the line being typed).
#[derive(Debug, thiserror::Error)]
#[error("stopped by SIGINT")]
pub struct StoppedBySigint;

/// Puts the terminal back as it was before the editor first read a line: for a process that
/// stops while the editor waits for a line (and has the terminal in raw mode).
pub fn restore_terminal() {
    if let Ok(saved) = SAVED_TERMINAL.lock()
        && let Some(settings) = saved.as_ref()
    {
        let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSANOW, settings);
    }
}

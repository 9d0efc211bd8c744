"""Atomic file replacement with recognisable, collectable temporary files.

``atomic_write(path, write)`` writes through one temporary file in ``path``'s
directory named ``<name>.pyflow-tmp-<pid>-<8 hex>``, flushes and fsyncs it,
``os.replace``s it over ``path`` and fsyncs the directory.  An exception
removes the temporary file; a kill cannot, so every save first removes the
*stale* temporary files of the same ``path``: those whose writer process is no
longer alive (judged with ``kill(pid, 0)`` on this machine), and this
process's own that are not a save in progress (a restarted container can hand
the new process the dead writer's pid).  A live process's file is left alone:
two processes saving to one path at once is not supported (the last rename
wins) but neither breaks the other's save.  A live pid reused by an unrelated
process keeps its stale file until a later save finds that pid gone.

Files named ``.<name>.<32 hex>.tmp`` (the temporary files of pyflow before it
named them by pid) are removed too: their writer cannot be known, and a
pyflow of that age saving the same path at the same time is not supported.
"""
import os
import re
import threading
import uuid

__all__ = ["atomic_write", "remove_stale_temporaries", "temporary_files", "TEMP_MARK"]

TEMP_MARK = ".pyflow-tmp-"
_in_progress = set()         # this process's temporary files being written now
_lock = threading.Lock()


def _resolve(path):
    path = os.fspath(path)
    if os.path.islink(path):  # write through a "latest -> ckpt-100" link, as open() would
        path = os.path.realpath(path)
    return path


def _pattern(name):
    return re.compile(re.escape(name) + re.escape(TEMP_MARK) + r"(\d+)-[0-9a-f]{8}\Z"
                      r"|\." + re.escape(name) + r"\.[0-9a-f]{32}\.tmp\Z")


def temporary_files(path):
    """[(temporary file path, writer pid or None)] of saves to ``path`` that
    are present in its directory (finished or not, stale or not)."""
    path = _resolve(path)
    directory, name = os.path.split(os.path.abspath(path))
    pattern = _pattern(name)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for entry in names:
        m = pattern.match(entry)
        if m:
            out.append((os.path.join(directory, entry), int(m.group(1)) if m.group(1) else None))
    return out


def _alive(pid, tmp):
    if pid is None:
        return False
    if pid == os.getpid():
        with _lock:
            return tmp in _in_progress
    if os.name != "posix":    # no signal-0 probe: keep what we cannot judge
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # exists, owned by someone else
        return True
    return True


def remove_stale_temporaries(path):
    """Remove the temporary files that killed saves to ``path`` left behind
    (see the module docstring for which); returns their paths."""
    removed = []
    for tmp, pid in temporary_files(path):
        if not _alive(pid, tmp):
            try:
                os.unlink(tmp)
                removed.append(tmp)
            except FileNotFoundError:
                pass          # another process collected it first
    return removed


def atomic_write(path, write):
    """Call ``write(f)`` with a binary file object on a fresh temporary file
    beside ``path``, make it durable, then rename it over ``path``.  The old
    file at ``path`` stays whole until the rename; any exception removes the
    temporary file and propagates (a full disk is the OSError of write)."""
    path = _resolve(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"save: directory '{directory}' of '{path}' does not exist")
    remove_stale_temporaries(path)   # before writing: their space may be needed
    tmp = os.path.join(directory, f"{os.path.basename(path)}{TEMP_MARK}{os.getpid()}-"
                                  f"{uuid.uuid4().hex[:8]}")
    with _lock:
        _in_progress.add(tmp)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                     0o666)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the new name can point to it
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        with _lock:
            _in_progress.discard(tmp)
    _fsync_dir(directory)


def _fsync_dir(directory):
    """Make the rename itself durable.  Best effort: some platforms and
    filesystems cannot open or fsync a directory, and the data is already
    safely in place by then."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)

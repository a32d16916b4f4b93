"""Virtual boards: the REPL over a pty, mpremote, Ctrl-C, soft/hard reset, heap budgets, clean-up."""

import errno
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from emulator_util import mpremote, open_port, read_until
from specmesh.host.boardclasses import BOARD_CLASSES
from specmesh.host.provision.flash import ROOT


def test_friendly_repl_over_the_pty(virtual_board):
    vb = virtual_board()
    with open_port(vb.port) as ser:
        ser.write(b"\x02")  # Ctrl-B: banner and prompt
        read_until(ser, b">>> ")
        ser.write(b"6*7\r")
        assert b"42" in read_until(ser, b"42\n>>> ")
        ser.write(b"for i in range(2):\r")
        read_until(ser, b"... ")
        ser.write(b"print('x%d' % i)\r\r")
        out = read_until(ser, b"x1\n>>> ")
        assert b"x0\n" in out


def test_mpremote_commands(virtual_board, tmp_path):
    vb = virtual_board()
    script = tmp_path / "hello.py"
    script.write_text("import sys\nprint('hello', sys.platform)\n")
    assert mpremote(vb.port, "exec", "print(6*7)").stdout == "42\n"
    assert mpremote(vb.port, "run", str(script)).stdout == "hello linux\n"
    assert mpremote(vb.port, "fs", "cp", str(script), ":hello.py").returncode == 0
    assert (vb.flash_dir / "hello.py").read_text() == script.read_text()  # the directory is the flash
    assert mpremote(vb.port, "fs", "mkdir", ":lib").returncode == 0
    listing = mpremote(vb.port, "fs", "ls", ":/").stdout
    assert "hello.py" in listing and "lib/" in listing
    assert mpremote(vb.port, "fs", "cat", ":hello.py").stdout == script.read_text()
    boots = vb.boots
    assert mpremote(vb.port, "soft-reset").returncode == 0
    assert mpremote(vb.port, "reset").returncode == 0
    assert vb.boots > boots
    err = mpremote(vb.port, "exec", "import nosuchmodule")
    assert err.returncode != 0 and "ImportError" in err.stdout + err.stderr
    assert mpremote(vb.port, "fs", "rm", ":hello.py").returncode == 0
    assert not (vb.flash_dir / "hello.py").exists()


def test_ctrl_c_interrupts_main_and_gives_the_repl_back(virtual_board):
    vb = virtual_board()
    (vb.flash_dir / "boot.py").write_text("print('boot ran')\n")
    (vb.flash_dir / "main.py").write_text("import time\nwhile True:\n    print('tick')\n    time.sleep_ms(20)\n")
    with open_port(vb.port) as ser:
        ser.write(b"\x03\x02")  # whatever runs, back to the REPL
        read_until(ser, b">>> ")
        ser.write(b"\x04")  # soft reset in the friendly REPL: boot.py, then main.py, as on a board
        out = read_until(ser, b"tick\ntick\n")
        assert b"MPY: soft reboot" in out and out.index(b"boot ran") < out.index(b"tick")
        ser.write(b"\x03")
        out = read_until(ser, b">>> ")
        assert b"KeyboardInterrupt" in out
        ser.write(b"print('alive')\r")
        read_until(ser, b"alive\n>>> ")
    # mpremote interrupts a running main.py on its own (after a hard reset main.py runs again)
    assert mpremote(vb.port, "reset").returncode == 0
    assert mpremote(vb.port, "exec", "print('took over')").stdout == "took over\n"


def test_heap_budget_per_board_class(virtual_board, tmp_path):
    esp32 = virtual_board("esp32")
    probe = "import gc; gc.collect(); print(gc.mem_free())"
    free = int(mpremote(esp32.port, "exec", probe).stdout)
    heap = BOARD_CLASSES["esp32"].heap_bytes
    assert heap - 8192 < free <= heap  # the program sees the board's heap, less mpremote's own code
    out = mpremote(esp32.port, "exec", "b = bytearray(%d)" % heap)
    assert "MemoryError" in out.stdout + out.stderr
    assert mpremote(esp32.port, "exec", "b = bytearray(60000); print(len(b))").stdout == "60000\n"
    # a ROMFS image bigger than the heap: on a board it is memory-mapped flash, and a file there is read in place
    image = tmp_path / "image"
    image.mkdir()
    (image / "weights.bin").write_bytes(bytes(range(256)) * 468)  # 119,808 bytes: more than the heap
    assert mpremote(esp32.port, "romfs", "deploy", str(image)).returncode == 0
    probe = ("import gc; gc.collect(); free = gc.mem_free(); m = memoryview(open('/rom/weights.bin', 'rb'));"
             " gc.collect(); print(free, gc.mem_free(), len(m), m[1000])")
    free, after, size, byte = (int(v) for v in mpremote(esp32.port, "exec", probe).stdout.split())
    assert heap - 8192 < free <= heap and (size, byte) == (119_808, 1000 % 256)
    assert free - after < 1024  # zero-copy: the file's bytes take no heap
    s3 = virtual_board("esp32s3")
    assert mpremote(s3.port, "exec", "b = bytearray(4000000); print(len(b))").stdout == "4000000\n"


def _df(port):
    """mount point -> (size, used) as `mpremote df` lists them."""
    rows = mpremote(port, "df").stdout.splitlines()[1:]
    return {r.split()[5]: (int(r.split()[1]), int(r.split()[2])) for r in rows}


def test_romfs_partition_as_mpremote_sees_it(virtual_board, tmp_path):
    """A virtual esp32 has its class's ROMFS partition, a host file beside its flash folder: `mpremote romfs
    query` and `deploy` work, the image is mounted at /rom (off the flash's usage) and outlives a reset;
    a board whose MicroPython has no ROMFS says so."""
    size = BOARD_CLASSES["esp32"].romfs_bytes
    vb = virtual_board()
    out = mpremote(vb.port, "romfs", "query").stdout
    assert "ROMFS0 partition has size %d bytes" % size in out and "Not a valid ROMFS" in out
    flash_used = _df(vb.port)["/"][1]
    src = tmp_path / "src"
    (src / "lib").mkdir(parents=True)
    (src / "hello.txt").write_text("from rom")
    (src / "lib" / "romlib.py").write_text("WHERE = __file__\n")
    assert mpremote(vb.port, "romfs", "deploy", str(src)).returncode == 0
    probe = "import romlib; print(open('/rom/hello.txt').read(), romlib.WHERE)"
    assert mpremote(vb.port, "exec", probe).stdout == "from rom /rom/lib/romlib.mpy\n"  # /rom/lib is on sys.path (deploy compiled it)
    assert mpremote(vb.port, "reset").returncode == 0
    assert mpremote(vb.port, "exec", probe).stdout == "from rom /rom/lib/romlib.mpy\n"
    assert "ROMFS image size" in mpremote(vb.port, "romfs", "query").stdout
    df = _df(vb.port)
    assert df["/"][1] == flash_used and 0 < df["/rom"][0] < 200
    assert vb.romfs_path.parent == vb.flash_dir.parent and vb.romfs_path.stat().st_size == size
    bare = virtual_board(romfs_bytes=0)
    assert mpremote(bare.port, "romfs", "query").stdout == "ROMFS is not enabled on this device\n"


@pytest.mark.parametrize("board", sorted(BOARD_CLASSES))
def test_df_and_uname_answer_as_on_the_board_class(virtual_board, board):
    """A folder flash reports the board class's filesystem (not the host disk), less what its files take;
    the read-only stand-ins at /.emu are not listed; os.uname() is the ESP32 firmware's."""
    cls = BOARD_CLASSES[board]
    vb = virtual_board(board)
    (vb.flash_dir / "data.bin").write_bytes(bytes(10_000))  # 3 blocks of 4 KiB
    rows = mpremote(vb.port, "df").stdout.splitlines()
    assert rows[0].split() == ["filesystem", "size", "used", "avail", "use%", "mounted", "on"]
    assert len(rows) == 2, rows  # the flash alone
    _, size, used, avail, _, mount = rows[1].split()
    assert mount == "/" and int(size) == cls.flash_fs_bytes
    assert int(used) >= 3 * 4096 and int(used) + int(avail) == int(size)
    out = mpremote(vb.port, "exec", "import os; u = os.uname(); print(u.sysname, '|', u.machine, '|', u.release)")
    sysname, machine, release = (x.strip() for x in out.stdout.split("|"))
    assert sysname == "esp32" and machine == cls.machine and release.count(".") == 2


def test_small_littlefs_flash_fills_up_and_board_stays_usable(virtual_board):
    vb = virtual_board(flash_bytes=64 * 1024)
    out = mpremote(vb.port, "exec", "import os; s = os.statvfs('/'); print(s[0] * s[2])")
    assert int(out.stdout) == 64 * 1024
    full = mpremote(vb.port, "exec", "f = open('big', 'wb')\nfor i in range(100): f.write(bytes(1024))\n")
    assert "ENOSPC" in full.stdout + full.stderr or "28" in full.stdout + full.stderr
    assert mpremote(vb.port, "exec", "import os; os.remove('big'); print('ok')").stdout == "ok\n"


@pytest.mark.parametrize("where", ["main thread", "thread that ends"])
def test_board_processes_end_with_their_owner(tmp_path, where):
    """The VM dies with the process that started it, SIGKILLed (no VM left behind), whether the board was started on
    the main thread or on one that has ended (a pipeline's boards, started side by side)."""
    start = ("vb = VirtualBoard(%r).start()" if where == "main thread" else
             "vb = VirtualBoard(%r); t = threading.Thread(target=vb.start); t.start(); t.join()")
    code = (
        "import sys, threading, time; sys.path.insert(0, %r)\n"
        "from specmesh.host.emulator import VirtualBoard\n"
        "%s; print(vb.pid, flush=True); time.sleep(60)\n"
        % (str(ROOT), start % str(tmp_path / "b"))
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        vm = int(owner.stdout.readline())
        os.kill(vm, 0)  # the VM runs
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(vm, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail("the board's VM outlived the process that started it")


def test_a_board_started_on_a_thread_that_ends_keeps_its_vm(tmp_path):
    """PR_SET_PDEATHSIG fires when the thread that forked the VM ends: a board started on a thread that then ended (a
    pipeline's boards, started and flashed side by side) had its VM SIGKILLed, and its supervisor booted it again
    ("VM exited with code -9; rebooting" on its console). Now its first VM runs on."""
    from specmesh.host.emulator import VirtualBoard

    vb = VirtualBoard(tmp_path / "b")
    try:
        starter = threading.Thread(target=vb.start)
        starter.start()
        starter.join()
        pid = vb.pid
        assert pid is not None
        proc = vb._proc
        with pytest.raises(subprocess.TimeoutExpired):  # it was killed at once as the thread ended
            proc.wait(timeout=1)
        assert (vb.pid, vb.boots) == (pid, 1)
        with open_port(vb.port) as ser:
            ser.write(b"\x02")  # Ctrl-B: banner and prompt, from the one VM booted
            out = read_until(ser, b">>> ")
        assert b"rebooting" not in out
    finally:
        vb.stop()


def test_stop_kills_the_vm(virtual_board):
    vb = virtual_board()
    pid = vb.pid
    vb.stop()
    with pytest.raises(ProcessLookupError):
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.02)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_emulate_command_serves_boards_until_ctrl_c_or_sigterm(tmp_path, stop):
    # started as a script's background job is: with SIGINT ignored (which Python keeps unless told otherwise)
    cmd = [sys.executable, "-X", "faulthandler", "-m", "specmesh.host.cli", "emulate", "--boards", "2", "--dir", str(tmp_path)]
    err = tmp_path / "stderr.txt"
    with open(err, "w") as err_file:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_file, text=True, cwd=ROOT,
                                preexec_fn=_ignore_sigint)
    try:
        summary = proc.stdout.readline()  # the same MACs as another emulate's boards, on a radio of their own
        assert "; their own radio (another emulate's boards do not hear them), MTU 250, loss 0.0. " in summary, summary
        ports = [proc.stdout.readline().split()[1] for _ in range(2)]
        assert all(p.startswith("/dev/pts/") for p in ports)
        assert mpremote(ports[1], "exec", "import network; print(network.WLAN().config('mac').hex())").stdout \
            == "02534d000002\n"
        vms = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(vms) == 2
        second = subprocess.run(cmd[:6] + ["--boards", "1", "--dir", str(tmp_path)], capture_output=True, text=True,
                                cwd=ROOT, timeout=60)  # the same folder: refused, the first's boards untouched
        assert second.returncode == 2 and second.stderr == (
            "specmesh emulate: error: virtual board folder %s is in use by another specmesh (pid %d): give this one "
            "another --dir\n" % (tmp_path / "board0", proc.pid))
        proc.send_signal(stop)
        try:
            assert proc.wait(timeout=15) == 0
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack to stderr
            proc.wait(timeout=10)
            pytest.fail("specmesh emulate did not stop within 15 s of %s; its threads:\n%s"
                        % (signal.Signals(stop).name, err.read_text()))
        assert proc.stdout.read().strip() == "stopped"
    finally:
        proc.kill()
    time.sleep(0.2)
    for pid in vms:
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
    assert (tmp_path / "board0").is_dir() and (tmp_path / "board1").is_dir()


def test_emulate_says_on_stderr_when_a_board_is_gone_for_good(tmp_path):
    """A board whose VM died with its flash folder deleted cannot start again: the emulate said nothing (only the
    board's own port did), kept running as if all were well and exited 0. Now: one line naming the board, its port
    and what to do, the other boards kept, and status 1 when stopped."""
    cmd = [sys.executable, "-m", "specmesh.host.cli", "emulate", "--boards", "2", "--dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        proc.stdout.readline()  # the summary line
        port = proc.stdout.readline().split()[1]
        proc.stdout.readline()
        vms = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        board0 = [pid for pid in vms if os.readlink("/proc/%s/cwd" % pid) == str(tmp_path / "board0")]  # its flash
        shutil.rmtree(tmp_path / "board0")
        os.kill(int(board0[0]), signal.SIGKILL)
        ready, _, _ = select.select([proc.stderr], [], [], 15)  # said within a poll of the emulate's (0.2 s)
        line = proc.stderr.readline() if ready else "(nothing on stderr within 15 s)"
        assert line == ("specmesh emulate: error: board0 on %s stopped: its flash folder %s is gone (deleted while the "
                        "board ran?): run again, which flashes it afresh; its port is closed, the other boards run on "
                        "(Ctrl-C stops them)\n" % (port, tmp_path / "board0")), line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 1
        assert proc.stdout.read().strip() == "stopped" and proc.stderr.read() == ""
    finally:
        proc.kill()


@pytest.mark.parametrize("in_the_way", ["board0", "board0.lock"])
def test_emulate_dir_with_something_in_a_boards_way_is_one_line(tmp_path, in_the_way):
    """A file where board0's flash folder goes, or a folder where its lock file goes, in --dir: the emulate said
    "[Errno 17] File exists: ..." or "[Errno 21] Is a directory: ..." and no way on. Now: what is in the way, and
    what to do, as a usage error (status 2), before any board starts."""
    if in_the_way == "board0":
        (tmp_path / in_the_way).write_text("")
    else:
        (tmp_path / in_the_way).mkdir()
    done = subprocess.run([sys.executable, "-m", "specmesh.host.cli", "emulate", "--boards", "1", "--dir", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("specmesh emulate: error: %s is in the way of a board's flash folder or its lock: remove it, "
                           "or give another --dir\n" % (tmp_path / in_the_way))


def test_unread_output_does_not_stall_the_board(virtual_board):
    vb = virtual_board()
    (vb.flash_dir / "main.py").write_text(
        "for i in range(3000):\n    print('x' * 99)\nopen('done', 'w').close()\n")
    assert mpremote(vb.port, "reset").returncode == 0  # main.py prints ~300 KB that nobody reads
    deadline = time.monotonic() + 10
    while not (vb.flash_dir / "done").exists():
        assert time.monotonic() < deadline, "the board stalled on output nobody read"
        time.sleep(0.05)
    assert vb.dropped_output > 0


def test_ctrl_c_is_a_plain_byte_when_the_program_turns_kbd_intr_off(virtual_board):
    vb = virtual_board()
    (vb.flash_dir / "main.py").write_text(
        "import micropython, sys\nmicropython.kbd_intr(-1)\nprint('ready')\n"
        "print('got', sys.stdin.buffer.read(1))\n")
    with open_port(vb.port) as ser:
        ser.write(b"\x03\x02")
        read_until(ser, b">>> ")
        ser.write(b"\x04")
        read_until(ser, b"ready\n")
        ser.write(b"\x03")
        assert b"got b'\\x03'" in read_until(ser, b">>> ")


def test_a_start_cut_off_as_it_makes_the_flash_image_leaves_none(tmp_path):
    """The littlefs image was opened, then sized: a start that stopped in between (a kill, a full quota; here
    the file size limit) left an empty flash.img, which every later `emulate --dir` refused as a flash of
    another size ('is 0 KiB ... give --flash-kb 0'). Now it is made beside, then renamed."""
    import resource

    code = ("import sys; sys.path.insert(0, %r)\nfrom specmesh.host.emulator import VirtualBoard\n"
            "try:\n VirtualBoard(%r, flash_bytes=64 * 1024).start()\nexcept OSError as e:\n print(e.errno)\n"
            % (str(ROOT), str(tmp_path / "b")))

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=limited)
    assert out.stdout.strip() == str(errno.EFBIG), out.stderr
    assert os.listdir(tmp_path / "b") == []


def test_an_empty_flash_image_is_no_flash_of_another_size(tmp_path):
    """An empty flash.img (what a start killed as it made the image left) holds no files: the start replaces it;
    it was refused, the message offering `--flash-kb 0`, which is no size."""
    from specmesh.host.emulator.board import VirtualBoard, check_flash_size

    vb = VirtualBoard(tmp_path / "b", flash_bytes=64 * 1024)
    vb.flash_dir.mkdir()
    (vb.flash_dir / "flash.img").write_bytes(b"")
    check_flash_size(vb)

# Sourced by scripts/test.sh: makes this machine an unlucky one before the tests run, so that
# the suite is shown to pass there too (issue 49; tests/README.md, rule 7):
#   unlucky_pids          process ids past 99 999: seven digits where pid_max allows (raised to
#                         4194304, the kernel's limit, when it is lower and we may), by writing
#                         /proc/sys/kernel/ns_last_pid (root or `sudo -n`), else by starting
#                         short processes until the ids pass 99 999
#   unlucky_kernel_env    the kernel environment the tests would otherwise find (the default
#                         one when IPYBOX_HOME is unset, as on CI) already holding packages a
#                         test might assume absent: iniconfig, six, packaging, pluggy
#   unlucky_runtime_base  a long runtime base: XDG_RUNTIME_DIR exported as a directory of 38
#                         bytes, the longest every kind of session fits in with a seven-digit
#                         pid (docs/kernel.md, "Socket paths fit by construction")
# Each says what it did on stderr and fails only where it must (a kernel environment it cannot
# install into); a machine that cannot be made unlucky in one way says so and goes on.

# `$@` as root, else through `sudo -n` (no password prompt), else fails.
_as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"; else return 1; fi
}

unlucky_pids() {
  local sys=/proc/sys/kernel max last want fresh
  if [ ! -r "$sys/pid_max" ] || [ ! -r "$sys/ns_last_pid" ]; then
    echo "unlucky-machine: no $sys/pid_max or ns_last_pid (not Linux?): process ids left as they are" >&2
    return 0
  fi
  max=$(cat "$sys/pid_max")
  if [ "$max" -lt 4194304 ] && _as_root sh -c "echo 4194304 > $sys/pid_max" 2>/dev/null; then
    echo "unlucky-machine: pid_max raised from $max to 4194304" >&2
    max=4194304
  fi
  if [ "$max" -gt 2000000 ]; then
    want=1500000
  elif [ "$max" -gt 110000 ]; then
    want=100000
  else
    echo "unlucky-machine: pid_max is $max and cannot be raised: process ids stay below 100000" >&2
    return 0
  fi
  last=$(cat "$sys/ns_last_pid")
  if [ "$last" -lt "$want" ] && ! _as_root sh -c "echo $want > $sys/ns_last_pid" 2>/dev/null; then
    # No right to set it: short processes until the ids pass 99 999 (about a minute at most).
    want=100000
    local deadline=$((SECONDS + 180))
    while [ "$(cat "$sys/ns_last_pid")" -lt "$want" ] && [ "$(cat "$sys/ns_last_pid")" -ge "$last" ] \
      && [ "$SECONDS" -lt "$deadline" ]; do
      for _ in 1 2 3 4 5 6 7 8 9 10; do (:); done
    done
  fi
  fresh=$(sh -c 'echo $$')
  echo "unlucky-machine: process ids now start at $fresh (pid_max $max)" >&2
}

# $1: the ipybox binary (its `setup` names the kernel environment's Python).
unlucky_kernel_env() {
  local python
  python=$("$1" setup 2>/dev/null | sed -n 's/^python: //p')
  if [ -z "$python" ]; then
    echo "unlucky-machine: \`$1 setup\` named no kernel environment" >&2
    return 1
  fi
  local pkgs=(iniconfig six packaging pluggy)
  if command -v uv >/dev/null 2>&1; then
    uv pip install -q --python "$python" "${pkgs[@]}" >&2
  else
    "$python" -I -m pip install -q "${pkgs[@]}" >&2
  fi
  echo "unlucky-machine: ${pkgs[*]} installed into the kernel environment of $python" >&2
}

# $1: the directory to make the base in (a place no test treats as special). Exports
# XDG_RUNTIME_DIR.
unlucky_runtime_base() {
  local parent="$1" len=38 base
  base="$parent/ipybox-long-runtime-base-"
  if [ "${#base}" -gt "$len" ]; then
    echo "unlucky-machine: $parent is too long for a $len-byte runtime base: XDG_RUNTIME_DIR left as it is" >&2
    return 0
  fi
  while [ "${#base}" -lt "$len" ]; do base="${base}x"; done
  mkdir -p "$base"
  chmod 0700 "$base"
  export XDG_RUNTIME_DIR="$base"
  echo "unlucky-machine: XDG_RUNTIME_DIR=$base (${#base} bytes)" >&2
}

# Shared by the benchmark scripts: where a result came from (date, commit, machine).
machine_lines() {
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' (+ uncommitted changes in src/)')"
  echo "- machine: $(nproc) CPU cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | head -1 || echo 'no GPU')"
}

# A fenced block: each argument a line (commands), or a file's content with `code_block -f FILE`.
code_block() {
  echo '```'
  if [ "$1" = "-f" ]; then cat "$2"; else printf '%s\n' "$@"; fi
  echo '```'
}

# Sourced by scripts/envtest-install and scripts/install-kubectl: building Kubernetes programs
# from the Go modules in this directory with the machine's Go (1.26 or newer), never another
# toolchain fetched on the fly.
#
# The modules' go.mod and go.sum pin every dependency; the Go module proxy serves them. Go's
# own caches (`go env GOMODCACHE GOCACHE`) hold the downloads and compiled packages; the
# binaries go where the caller says, with a stamp naming the recipe.

GO="${DURABLE_INFORMER_GO:-go}"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
GO_MODULES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Fails unless $GO is Go 1.26 or newer; prints its version (go1.26.8).
go_check() {
    local v major minor
    command -v "$GO" >/dev/null || {
        echo "no '$GO' on PATH: Go 1.26 or newer is needed (DURABLE_INFORMER_GO names another)" >&2
        return 1
    }
    v="$("$GO" env GOVERSION)"
    major="${v#go}"
    major="${major%%.*}"
    minor="${v#go*.}"
    minor="${minor%%.*}"
    minor="${minor%%[!0-9]*}"
    if [ "$major" -lt 1 ] || { [ "$major" -eq 1 ] && [ "${minor:-0}" -lt 26 ]; }; then
        echo "$GO is $v: Go 1.26 or newer is needed (DURABLE_INFORMER_GO names another)" >&2
        return 1
    fi
    echo "$v"
}

# A short hash of the named module directories' go.mod and go.sum: part of every stamp, so a
# changed pin rebuilds.
go_recipe_hash() {
    local d
    for d in "$@"; do cat "$GO_MODULES/$d/go.mod" "$GO_MODULES/$d/go.sum"; done | sha256sum | cut -c1-16
}

# Builds package $3 of module directory $1 into file $2 (through a temporary name, so an
# interrupted build leaves no half-written binary), with -ldflags $4.
go_build() {
    local dir="$1" out="$2" pkg="$3" ldflags="${4:-}"
    mkdir -p "$(dirname "$out")"
    (cd "$GO_MODULES/$dir" && "$GO" build -trimpath -ldflags "-s -w $ldflags" -o "$out.new" "$pkg")
    mv -f "$out.new" "$out"
}

# The -X flags that give a Kubernetes binary built from module directory $1 its version
# (k8s.io/kubernetes's, as `--version` and /version report it).
k8s_version_ldflags() {
    local dir="$1" version time major minor flags="" pkg
    read -r version time < <(cd "$GO_MODULES/$dir" &&
        "$GO" list -m -f '{{.Version}} {{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)
    major="${version#v}"
    major="${major%%.*}"
    minor="${version#v*.}"
    minor="${minor%%.*}"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags="$flags -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
        flags="$flags -X $pkg.gitTreeState=clean -X $pkg.buildDate=${time:-1970-01-01T00:00:00Z}"
    done
    echo "$flags"
}

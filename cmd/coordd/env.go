package main

import (
	"flag"
	"log/slog"
	"reflect"
	"slices"
	"strings"
)

// flagEnvName is the environment variable of the flag name:
// --metrics-listen is COORDD_METRICS_LISTEN.
func flagEnvName(name string) string {
	return envPrefix + "_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// clientEnv are the COORDD_* variables that coordd's companions read
// (mdn-mcp, the MCP server and command of the TypeScript and Python
// clients), which a shell that runs coordd beside them may well hold.
var clientEnv = []string{"COORDD_TOKEN"}

// strayVar is a COORDD_* variable that names no flag and that the
// configuration does not name either, and the known one it is likely a
// typo of ("" if none is near).
type strayVar struct{ name, hint string }

// strayEnv returns, sorted, the COORDD_* variables of environ (os.Environ's
// form, NAME=VALUE) that name no flag of fs and that no *_env field of fc
// names: a misspelt variable (COORDD_REDSI) that would otherwise be ignored
// without a word. The values are never looked at.
func strayEnv(environ []string, fs *flag.FlagSet, fc *fileConfig) []strayVar {
	known := append(envFields(reflect.ValueOf(fc)), clientEnv...)
	isFlag := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		isFlag[flagEnvName(f.Name)] = true
		if !actionFlags[f.Name] {
			known = append(known, flagEnvName(f.Name))
		}
	})
	var names []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix+"_") && !isFlag[name] && !slices.Contains(known, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var stray []strayVar
	for _, name := range slices.Compact(names) {
		stray = append(stray, strayVar{name, closest(name, known)})
	}
	return stray
}

// warnStrayEnv logs a WARN line for each of stray, naming the variable,
// never its value, and the known variable it is likely a typo of. A
// warning, not a refusal: in a rolling deploy one environment may serve
// two versions of coordd, and a variable meant for the newer one must not
// stop the older one from starting.
func warnStrayEnv(log *slog.Logger, stray []strayVar) {
	for _, v := range stray {
		attrs := []any{"variable", v.name}
		if v.hint != "" {
			attrs = append(attrs, "did_you_mean", v.hint)
		}
		log.Warn("environment variable ignored: it names no flag, and no *_env field of the configuration names it", attrs...)
	}
}

// envFields returns the values of every string field of v (a struct, or a
// pointer to one, walked through its structs, pointers, slices and maps)
// whose yaml key ends in _env: the environment variables the configuration
// names (tokens_env, redis_password_env, a credential's value_env, and any
// such field added later).
func envFields(v reflect.Value) []string {
	var out []string
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer, reflect.Interface:
			if !v.IsNil() {
				walk(v.Elem())
			}
		case reflect.Slice, reflect.Array:
			for i := range v.Len() {
				walk(v.Index(i))
			}
		case reflect.Map:
			for it := v.MapRange(); it.Next(); {
				walk(it.Value())
			}
		case reflect.Struct:
			t := v.Type()
			for i := range t.NumField() {
				f := t.Field(i)
				if !f.IsExported() && !f.Anonymous {
					continue
				}
				key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
				if fv := v.Field(i); strings.HasSuffix(key, "_env") && fv.Kind() == reflect.String {
					if s := fv.String(); s != "" {
						out = append(out, s)
					}
				} else {
					walk(fv)
				}
			}
		}
	}
	walk(v)
	return out
}

// closest returns the one of candidates nearest to s, if it is within a
// few edits of it (a typo); else "".
func closest(s string, candidates []string) string {
	best, bestD := "", max(2, len(s)/5)+1
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
// Hand-rolled: a dozen lines for a hint in a warning, not worth a
// dependency.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, sub)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Package cliflag is how matbus reads its flags: a flag set whose usage
// lists each flag's environment variable, parsing that takes every flag
// not given on the command line from the environment (MATBUS_<FLAG>, the
// old controller's names where the meaning is the same, and its newer
// names as aliases), one-line errors naming the flag or variable and the
// value wanted, and the flag types matbus needs (comma lists, positive
// durations, durations where 0 is off). It never reads os.Environ itself:
// the caller passes a Lookup (os.LookupEnv in matbus).
package cliflag

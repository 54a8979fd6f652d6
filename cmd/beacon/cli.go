package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Exit statuses, as etcdctl and most Unix tools use them.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and failed (unreachable store, port in use, ...)
	exitUsage   = 2 // the command line or the environment is wrong; nothing was done
)

// usageError marks bad input: an unknown command or flag, a wrong number
// of arguments, a value a flag or variable cannot take. It exits with
// exitUsage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usage marks err (nil stays nil) as bad input.
func usage(err error) error {
	if err == nil {
		return nil
	}
	var u usageError
	if errors.As(err, &u) {
		return err
	}
	return usageError{err}
}

// usagef is usage(fmt.Errorf(...)).
func usagef(format string, args ...any) error { return usage(fmt.Errorf(format, args...)) }

// cobraUsagePrefixes are the messages of the errors cobra itself returns
// for bad command lines that do not pass through the hooks set in setup
// (required flags are checked before any hook runs).
var cobraUsagePrefixes = []string{"required flag(s)", "if any flags in the group", "none of the flags in the group", "at least one of the flags in the group"}

// exitCode maps an error to the process's exit status.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var u usageError
	if errors.As(err, &u) {
		return exitUsage
	}
	for _, p := range cobraUsagePrefixes {
		if strings.HasPrefix(err.Error(), p) {
			return exitUsage
		}
	}
	return exitFailure
}

// errorLine renders err as the one line main prints: "beacon: ...", with
// the configuration fields libraries name replaced by their flags, several
// problems (errors.Join) separated by "; " and without the "beacon: " of
// the root package's errors repeated after the program's.
func errorLine(err error) string {
	msg := strings.ReplaceAll(strings.TrimSpace(withFlagNames(err).Error()), "\n", "; ")
	for strings.HasPrefix(msg, "beacon: ") {
		msg = strings.TrimPrefix(msg, "beacon: ")
	}
	msg = strings.ReplaceAll(msg, ": beacon: ", ": ")
	msg = strings.ReplaceAll(msg, "; beacon: ", "; ")
	return "beacon: " + msg
}

// execute prepares the command tree and runs it.
func execute(ctx context.Context, root *cobra.Command, args []string) error {
	setup(root)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

// setup applies the habits every command shares, also to commands added
// later by other files: bad flags and argument counts are usage errors,
// an unknown subcommand is an error (not help), -w/--write-out is an alias
// of -o/--output, and values complete in the shell.
func setup(root *cobra.Command) {
	cobra.EnableTraverseRunHooks = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage(err) })
	// cobra adds its help and completion commands when it executes, after
	// this walk: add them now, so that they follow the same habits
	// (`beacon completion bash extra` and `beacon help stauts` are bad
	// usage too).
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	walk(root, func(c *cobra.Command) {
		c.SilenceUsage, c.SilenceErrors = true, true
		if c.Name() == "help" && c.Parent() == root {
			c.Args = unknownHelpTopic
			return
		}
		if c.HasSubCommands() && c.Run == nil && c.RunE == nil {
			// A group: without a subcommand it shows its help; with an
			// unknown one it fails (cobra would show help and exit 0).
			c.Args = unknownSubcommand
			c.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
		} else if c.Args != nil {
			args := c.Args
			c.Args = func(c *cobra.Command, a []string) error { return usage(args(c, a)) }
		}
		addWriteOutAlias(c)
		registerCompletions(c) // completion.go
	})
}

// walk calls fn on c and every command below it.
func walk(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, sub := range c.Commands() {
		walk(sub, fn)
	}
}

// unknownSubcommand refuses arguments to a command group, suggesting the
// closest subcommand.
func unknownSubcommand(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
	if c.SuggestionsMinimumDistance <= 0 {
		c.SuggestionsMinimumDistance = 2
	}
	if s := c.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %q?)", s[0])
	}
	var names []string
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() {
			names = append(names, sub.Name())
		}
	}
	return usagef("%s; commands: %s (see %s --help)", msg, strings.Join(names, ", "), c.CommandPath())
}

// unknownHelpTopic refuses `beacon help` for a command that does not
// exist, as unknownSubcommand does for the command itself (cobra prints
// "Unknown help topic" and the usage, and exits 0).
func unknownHelpTopic(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	found, rest, err := c.Root().Find(args)
	switch {
	case err != nil || found == nil:
		found, rest = c.Root(), args
	case len(rest) == 0:
		return nil
	}
	return unknownSubcommand(found, rest)
}

// addWriteOutAlias gives a command that has -o/--output etcdctl's
// spelling too, -w/--write-out, bound to the same value.
func addWriteOutAlias(c *cobra.Command) {
	f := c.Flags()
	out := f.Lookup("output")
	if out == nil || f.Lookup("write-out") != nil {
		return
	}
	short := "w"
	if f.ShorthandLookup("w") != nil {
		short = ""
	}
	f.VarP(out.Value, "write-out", short, "alias of --output (etcdctl's spelling)")
}

// outputChanged reports whether -o or -w was given.
func outputChanged(f *pflag.FlagSet) bool {
	for _, n := range []string{"output", "write-out"} {
		if fl := f.Lookup(n); fl != nil && fl.Changed {
			return true
		}
	}
	return false
}

// applyWriteOutEnv honours ETCDCTL_WRITE_OUT for a command with -o that
// was not given one: json selects JSON, simple and table keep the
// command's human-readable default; anything else is refused, naming the
// variable.
func applyWriteOutEnv(c *cobra.Command) error {
	f := c.Flags()
	out := f.Lookup("output")
	v, ok := os.LookupEnv(envWriteOut)
	if out == nil || !ok || v == "" || outputChanged(f) {
		return nil
	}
	switch v {
	case "json":
		return out.Value.Set("json")
	case "simple", "table":
		return nil
	}
	return usagef("%s=%q: beacon writes json or its human-readable default (%s); unset the variable or pass -o", envWriteOut, v, out.DefValue)
}

// emptyMeans is the annotation of a flag that takes an empty value on
// purpose; its value says what empty means, for errors about the others.
const emptyMeans = "beacon-empty-means"

// allowEmpty marks flag of c as taking an empty value (--flag=) that
// means what meaning says (the flag's help must say it too).
func allowEmpty(c *cobra.Command, flag, meaning string) {
	if err := c.Flags().SetAnnotation(flag, emptyMeans, []string{meaning}); err != nil {
		panic(err) // a flag not (yet) defined: a mistake in the command's code
	}
}

// checkEmptyFlags refuses a flag given an empty value, or a list with an
// empty item, unless it is marked with allowEmpty: `--endpoints ""` used
// the default endpoint, `--etcd-endpoints "$UNSET"` ran embedded etcd, and
// `--data-dir ""` put the data somewhere unsaid, all without a word.
func checkEmptyFlags(c *cobra.Command) error {
	var err error
	c.Flags().VisitAll(func(fl *pflag.Flag) {
		if err != nil || !fl.Changed || len(fl.Annotations[emptyMeans]) > 0 {
			return
		}
		empty := false
		if sv, ok := fl.Value.(pflag.SliceValue); ok {
			items := sv.GetSlice()
			empty = len(items) == 0
			for _, it := range items {
				empty = empty || strings.TrimSpace(it) == ""
			}
		} else if fl.Value.Type() == "string" {
			empty = strings.TrimSpace(fl.Value.String()) == ""
		}
		if !empty {
			return
		}
		def := "leave it out"
		if fl.DefValue != "" && fl.DefValue != "[]" {
			def += " for its default, " + strings.Trim(fl.DefValue, "[]")
		}
		err = usagef("--%s %q: empty (an unset variable?): give a value, or %s", fl.Name, flagString(fl), def)
	})
	return err
}

// zeroMeans is the annotation of a numeric flag that takes 0 on purpose;
// its value says what 0 means (the flag's help must say it too).
const zeroMeans = "beacon-zero-means"

// allowZero marks flag of c as taking 0, meaning what meaning says.
func allowZero(c *cobra.Command, flag, meaning string) {
	if err := c.Flags().SetAnnotation(flag, zeroMeans, []string{meaning}); err != nil {
		panic(err) // a flag not (yet) defined: a mistake in the command's code
	}
}

// zeroUnchecked are flags whose 0 is being given its meaning elsewhere
// (the per-address connection caps, issue 21 §4).
var zeroUnchecked = map[string]bool{"http-max-connections-per-client": true}

// checkZeroFlags refuses a numeric flag given 0 unless it is marked with
// allowZero: `--proxy-refresh-interval 0`, `--max-watches 0` or
// `--shutdown-timeout 0` silently meant the default, which 0 (none? no
// limit? never?) does not say.
//
// It refuses, too, a bound (an integer flag named max-…) given a negative
// value, unless it is -1 and the flag says "-1: no limit": --max-watchers
// -2 silently meant no limit.
func checkZeroFlags(c *cobra.Command) error {
	var err error
	c.Flags().VisitAll(func(fl *pflag.Flag) {
		if err == nil && fl.Changed {
			err = checkBoundFlag(fl)
		}
		if err != nil || !fl.Changed || len(fl.Annotations[zeroMeans]) > 0 || zeroUnchecked[fl.Name] {
			return
		}
		if v := fl.Value.String(); !numericFlag(fl) || (v != "0" && v != "0s") {
			return
		}
		def := "leave it out for its default"
		if fl.DefValue != "0" && fl.DefValue != "0s" {
			def += ", " + fl.DefValue
		}
		if strings.Contains(fl.Usage, "-1: no limit") {
			def += "; -1 for no limit"
		}
		err = usagef("--%s %s: 0 is not a value of this flag (not \"none\", \"never\" nor \"no limit\"): give a positive value, or %s", fl.Name, fl.Value, def)
	})
	return err
}

// checkBoundFlag refuses a negative value of a bound (an integer flag
// whose name has max in it) but the -1 of one that says "-1: no limit".
func checkBoundFlag(fl *pflag.Flag) error {
	if !strings.Contains(fl.Name, "max") || !strings.HasPrefix(fl.Value.Type(), "int") {
		return nil
	}
	n, perr := strconv.ParseInt(fl.Value.String(), 10, 64)
	noLimit := strings.Contains(fl.Usage, "-1: no limit")
	if perr != nil || n >= 0 || (n == -1 && noLimit) {
		return nil
	}
	if noLimit {
		return usagef("--%s %d: a bound is a positive number, or -1 for no limit", fl.Name, n)
	}
	return usagef("--%s %d: a bound is a positive number (leave it out for its default, %s)", fl.Name, n, fl.DefValue)
}

// numericFlag reports whether fl takes a number or a duration.
func numericFlag(fl *pflag.Flag) bool {
	switch fl.Value.Type() {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64",
		"float32", "float64", "duration":
		return true
	}
	return false
}

// setting is where a value came from, for error messages: a flag given on
// the command line, or an environment variable.
type setting struct {
	flag string // the flag's name, without dashes
	env  string // the variable it came from; "" when from the flag or the default
	val  string
}

// String names the setting as the user wrote it: --flag "value" or
// VARIABLE="value".
func (s setting) String() string {
	if s.env != "" {
		return fmt.Sprintf("%s=%q", s.env, s.val)
	}
	return fmt.Sprintf("--%s %q", s.flag, s.val)
}

// lookup returns the value of a string flag if it was given, else of the
// first of envs that is set and not empty, else the flag's default.
func lookup(f *pflag.FlagSet, flag string, envs ...string) setting {
	fl := f.Lookup(flag)
	if fl.Changed {
		return setting{flag: flag, val: flagString(fl)}
	}
	for _, e := range envs {
		if v := os.Getenv(e); v != "" {
			return setting{flag: flag, env: e, val: v}
		}
	}
	return setting{flag: flag, val: flagString(fl)}
}

// flagString returns a flag's value as the user would write it (a slice
// flag's items joined with commas).
func flagString(fl *pflag.Flag) string {
	if sv, ok := fl.Value.(pflag.SliceValue); ok {
		return strings.Join(sv.GetSlice(), ",")
	}
	return fl.Value.String()
}

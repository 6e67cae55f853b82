// Package settings reads the Caddyfile blocks of the handler and of its
// state engines the same way: one value per setting, each setting once.
package settings

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Each reads a block of one-value settings, with no argument on the
// block's own line, and hands each setting and its value to set; a
// setting given twice is refused.
func Each(d *caddyfile.Dispenser, set func(setting, val string) error) error {
	d.Next() // the directive's or engine's name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := Seen{}
	for d.NextBlock(0) {
		setting := d.Val()
		if err := seen.Once(d, setting); err != nil {
			return err
		}
		if !d.NextArg() {
			return d.ArgErr()
		}
		if err := set(setting, d.Val()); err != nil {
			return err
		}
	}
	return nil
}

// Seen refuses a setting given twice in one block: the second would
// silently override the first.
type Seen map[string]bool

// Once records setting, or refuses it if the block gave it before.
func (s Seen) Once(d *caddyfile.Dispenser, setting string) error {
	if s[setting] {
		return d.Errf("%s: given twice", setting)
	}
	s[setting] = true
	return nil
}

// End ends the line of a setting: the value's parse error, named by its
// setting, or values left over.
func End(d *caddyfile.Dispenser, setting string, err error) error {
	if err != nil {
		return d.Errf("%s: %v", setting, err)
	}
	if d.NextArg() {
		return d.Errf("%s: too many values", setting)
	}
	return nil
}

// Duration parses a Caddy duration ("250ms", "1d").
func Duration(s string) (caddy.Duration, error) {
	d, err := caddy.ParseDuration(s)
	return caddy.Duration(d), err
}

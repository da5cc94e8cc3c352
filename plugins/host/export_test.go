package host

import "io"

// SetLogOutput sends g's plugin logs (go-plugin's client and the plugin's
// relayed lines) to w instead of os.Stderr; call it before the first query.
func SetLogOutput(g *Gate, w io.Writer) {
	g.stderr = newRateWriter(w, g.cfg.LogRate, "plugin."+g.name)
}

package cockpittest

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Login signs in through Cockpit's own login page at baseURL (e.g.
// http://127.0.0.1:9090) as a user with a password, the way a person does:
// it fills the form, presses the button and waits until the shell has
// replaced the login page. The password travels only over the DevTools
// connection; it is in no error this returns.
func (b *Browser) Login(timeout time.Duration, baseURL, user, password string) error {
	if err := b.Go(timeout, baseURL+"/"); err != nil {
		return err
	}
	if err := b.WaitFor(timeout, `(() => { const u = document.getElementById("login-user-input"), b = document.getElementById("login-button");
		return !!(u && b && u.offsetParent !== null && b.offsetParent !== null && !b.disabled); })()`); err != nil {
		return fmt.Errorf("cannot find Cockpit's login page at %s: %w", baseURL, err)
	}
	u, _ := json.Marshal(user)
	p, _ := json.Marshal(password)
	fill := `(() => { document.getElementById("login-user-input").value = ` + string(u) + `;
		document.getElementById("login-password-input").value = ` + string(p) + `;
		document.getElementById("login-button").click(); return true })()`
	if _, err := Eval[bool](b, timeout, fill); err != nil {
		return errors.New("cannot fill in Cockpit's login form")
	}
	// login.js shows the form once it has set up its handlers.
	// Either the shell comes up (its navigation and frames), or the login
	// page says why not.
	const outcome = `(() => { const e = document.getElementById("login-error-message");
		if (e && e.textContent.trim() && e.offsetParent !== null) return true;
		return !document.getElementById("login-user-input") && !!document.querySelector("iframe"); })()`
	if err := b.WaitFor(timeout, outcome); err != nil {
		text, _ := Eval[string](b, 5*time.Second, `location.href + "\n" + document.body.innerText`)
		return fmt.Errorf("cannot log in to Cockpit as %s: neither the shell nor an error came up (%v); the browser shows:\n%s", user, err, text)
	}
	if msg, _ := Eval[string](b, 5*time.Second, `(document.getElementById("login-user-input") && document.getElementById("login-error-message")?.textContent.trim()) || ""`); msg != "" {
		return fmt.Errorf("Cockpit refused the login of %s: %s", user, msg)
	}
	return nil
}

// linreboot /ui: the login form posts JSON (the token in the body, never in a URL), and
// the logout button; pages refresh themselves where they say so (data-refresh, seconds).
"use strict";

async function post(path, body) {
  return fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
    credentials: "same-origin",
  });
}

const login = document.getElementById("login");
if (login) {
  login.addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = document.getElementById("token").value;
    const answer = await post("/ui/login", { token });
    if (answer.ok) {
      window.location.assign("/ui");
    } else {
      const body = await answer.json().catch(() => ({}));
      document.getElementById("error").textContent = body.message || "not signed in";
    }
  });
}

const logout = document.getElementById("logout");
if (logout) {
  logout.addEventListener("submit", async (event) => {
    event.preventDefault();
    await post("/ui/logout", {});
    window.location.assign("/ui");
  });
}

// A page refreshes itself, but not under someone filling in its form (the evaluation
// form): once a field has been touched, or while one has the focus, it waits.
let touched = false;
document.addEventListener("input", () => { touched = true; });
const refresh = Number(document.body.dataset.refresh || 0);
function reloadWhenIdle() {
  const focused = document.activeElement;
  if (touched || (focused && focused.closest("form"))) {
    setTimeout(reloadWhenIdle, refresh * 1000);
  } else {
    window.location.reload();
  }
}
if (refresh > 0) {
  setTimeout(reloadWhenIdle, refresh * 1000);
}

// aijob dashboard: refreshes the live part of a page and asks before an action.
// No inline script anywhere (the Content-Security-Policy allows only this file).
'use strict';

(function () {
  function liveUrl() {
    var params = new URLSearchParams(window.location.search);
    params.delete('notice');
    params.set('part', 'live');
    return window.location.pathname + '?' + params.toString();
  }

  function refresh(region, every) {
    var timer = null;
    function tick() {
      if (document.hidden) { timer = window.setTimeout(tick, every); return; }
      fetch(liveUrl(), { credentials: 'same-origin', headers: { Accept: 'text/html' } })
        .then(function (response) {
          if (response.headers.get('X-Dashboard-Part') !== 'live') {
            window.location.reload(); // signed out or session expired: show the sign-in form
            return null;
          }
          var final = response.headers.get('X-Dashboard-Final') === '1';
          return response.text().then(function (html) {
            region.innerHTML = html; // server-rendered, every value escaped there
            if (!final) { timer = window.setTimeout(tick, every); }
          });
        })
        .catch(function () { timer = window.setTimeout(tick, every * 2); });
    }
    timer = window.setTimeout(tick, every);
    return function () { window.clearTimeout(timer); };
  }

  document.addEventListener('DOMContentLoaded', function () {
    document.querySelectorAll('[data-live]').forEach(function (region) {
      var every = parseInt(region.getAttribute('data-live'), 10);
      if (every > 0) { refresh(region, every); }
    });
  });

  // Forms with data-confirm ask first; delegated so that refreshed parts keep it.
  document.addEventListener('submit', function (event) {
    var message = event.target.getAttribute('data-confirm');
    if (message && !window.confirm(message)) { event.preventDefault(); }
  });
})();

% rebase('base')
<section class="login">
  <h1>Sign in</h1>
% if get('message'):
  <p class="alert" role="alert">{{message}}</p>
% end
  <form method="post" action="{{prefix}}/login">
    <input type="hidden" name="csrf" value="{{login_csrf}}">
    <label for="token">Admin token</label>
    <input id="token" name="token" type="password" autocomplete="off" required autofocus>
    <button type="submit">Sign in</button>
  </form>
  <p class="muted">A SUPER_ADMIN token (the CLI's <code>token create --user USER --admin</code>).
  It is exchanged for a session; the token itself is not kept in the browser.</p>
</section>

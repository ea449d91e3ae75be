% rebase('base')
<section class="error">
  <h1>{{status}} <code>{{code}}</code></h1>
  <p>{{message}}</p>
  <p><a href="{{prefix}}">Back to the overview</a></p>
</section>
